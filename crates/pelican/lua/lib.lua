-- lib.lua: helpers shared by the scripts below; pelican prepends this file to
-- every script that needs it (Redis cannot share code between scripts).
--
-- Vocabulary
--   request key  KEYS "reqp" .. rid: a string.
--                pending: "P<stream id>;<deadline ms>;<producer>;<producer>;..."
--                done:    an outcome (below), kept for result_ttl.
--   outcome      a tag byte then a payload: "O"<response body> | "E"<message of a
--                remote error> | "D"<dead-letter reason> | "X"<expiry note> |
--                "C"<cancellation note>.
--   reply entry  on "replyp" .. producer: one or more pairs <rid> <outcome>; a script
--                pushes ONE entry per producer for all the outcomes it produced.

-- Outcomes to push, by producer: a flat list rid, outcome, rid, outcome, ...
local replies = {}

-- Fields of a stream entry (a flat array) as a table name -> value, first wins.
local function fields_map(flat)
  local m = {}
  if not flat then return m end
  for i = 1, #flat, 2 do
    if m[flat[i]] == nil then m[flat[i]] = flat[i + 1] end
  end
  return m
end

-- The producers waiting on a pending request value "P<sid>;<deadline>;p1;p2;".
local function pending_waiters(v)
  local out, n = {}, 0
  for part in string.gmatch(v, '([^;]*);') do
    n = n + 1
    if n > 2 and part ~= '' then out[#out + 1] = part end
  end
  return out
end

-- Resolves request `rid` (held by stream entry `sid`) with `outcome` and queues it for
-- every waiting producer (sent by `flush_replies`, which every script calls last).
-- Callers have won the XACK gate for `sid` already, so this is the entry's one outcome.
-- Indexed requests (dedup on): the outcome replaces the pending value only if that
-- value still points at `sid`. Another entry can carry the same rid (a garbage or
-- foreign entry, a requeued dead letter while the rid is in flight again, an entry whose
-- index expired and was submitted afresh); its outcome must neither resolve the request
-- the index tracks nor overwrite an outcome already recorded (first outcome wins).
-- ttl 0 deletes the key instead. Requests without an index have one waiter, `from`,
-- and no stored outcome.
-- Returns the number of producers told.
local function finish(reqp, replyp, rid, sid, from, indexed, outcome, ttl, maxlen)
  if rid == nil or rid == '' then return 0 end
  local waiters = {}
  if indexed == '1' then
    local key = reqp .. rid
    local old = redis.call('GET', key)
    if old and string.sub(old, 1, #sid + 2) == 'P' .. sid .. ';' then
      waiters = pending_waiters(old)
    elseif old then
      return 0
    elseif from and from ~= '' then
      -- the index expired before the work was done; its submitter may still wait
      waiters[1] = from
    end
    if ttl > 0 then
      redis.call('SET', key, outcome, 'PX', ttl)
    elseif old then
      redis.call('DEL', key)
    end
  elseif from and from ~= '' then
    waiters[1] = from
  end
  for _, w in ipairs(waiters) do
    local flat = replies[w]
    if not flat then
      flat = {}
      replies[w] = flat
    end
    flat[#flat + 1] = rid
    flat[#flat + 1] = outcome
  end
  return #waiters
end

-- Pushes the outcomes collected by `finish`: one XADD per producer, not per outcome.
-- NOMKSTREAM: a producer whose reply stream expired is gone; do not recreate it.
local function flush_replies(replyp, maxlen)
  for w, flat in pairs(replies) do
    for i = 1, #flat, 400 do
      redis.call('XADD', replyp .. w, 'NOMKSTREAM', 'MAXLEN', '~', maxlen, '*',
        unpack(flat, i, math.min(i + 399, #flat)))
    end
  end
  replies = {}
end

-- Moves stream entry `sid` (fields `flat`) to the dead-letter stream with
-- `reason`, acknowledges and deletes it, and tells its waiters.
-- A value longer than `max_body` is not copied (an oversized body must not be stored
-- twice); its length is recorded as `<field>_bytes` instead.
local function bury(stream, dead, reqp, replyp, group, sid, flat, reason, deliveries, consumer, now, ttl, maxlen, dead_maxlen, max_body)
  local args = { 'XADD', dead, 'MAXLEN', '~', dead_maxlen, '*',
    'entry', sid, 'reason', reason, 'deliveries', deliveries, 'consumer', consumer, 'dead_at', now }
  if flat then
    for i = 1, #flat - 1, 2 do
      if #flat[i + 1] > max_body then
        args[#args + 1] = flat[i] .. '_bytes'
        args[#args + 1] = #flat[i + 1]
      else
        args[#args + 1] = flat[i]
        args[#args + 1] = flat[i + 1]
      end
    end
  end
  redis.call(unpack(args))
  redis.call('XACK', stream, group, sid)
  redis.call('XDEL', stream, sid)
  local f = fields_map(flat)
  return finish(reqp, replyp, f['rid'], sid, f['from'], f['index'], 'D' .. reason, ttl, maxlen)
end
