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

-- A whole number of milliseconds as a command argument. Lua would pass a number on
-- formatted with printf's %.17g (slow, and a real share of the server's time at high
-- rates); %d is cheap, and each value is formatted once per script call.
local ms_args = {}
local function ms_arg(n)
  local s = ms_args[n]
  if not s then
    s = string.format('%d', n)
    ms_args[n] = s
  end
  return s
end

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

-- Puts `outcome` in place of the index value at `key` if that value is the pending
-- state of stream entry `sid`, in one command (SET ... GET). Returns
--   'won', waiters  it was: replaced; these producers wait for the outcome
--   'other'         it belongs to another entry (a garbage or foreign entry carrying the
--                   rid, a requeued dead letter while the rid is in flight again, an
--                   entry whose index expired and was submitted afresh) or is an outcome
--                   already recorded: put back as it was (first outcome wins)
--   'gone'          there was no value (it expired); `outcome` is stored now
-- ttl 0 deletes the value instead of replacing it.
local function settle(key, sid, outcome, ttl, now, grace)
  local old
  if ttl > 0 then
    old = redis.pcall('SET', key, outcome, 'PX', ms_arg(ttl), 'GET')
  else
    old = redis.pcall('GETDEL', key)
  end
  if type(old) == 'table' and old.err then
    -- Not a string: a foreign client's key, not an index. It must not abort the script
    -- (a batch's other outcomes would be half recorded): overwrite it, as if it expired.
    if ttl > 0 then
      redis.call('SET', key, outcome, 'PX', ms_arg(ttl))
    else
      redis.call('DEL', key)
    end
    old = false
  end
  if not old then return 'gone' end
  local head = 'P' .. sid .. ';'
  if string.sub(old, 1, #head) == head then
    return 'won', pending_waiters(old)
  end
  local px = ttl
  if string.sub(old, 1, 1) == 'P' then
    local dl = tonumber(string.match(old, '^P[^;]*;([^;]*);')) or now
    px = math.max(dl - now, 1) + grace
  end
  if px <= 0 then px = grace end
  redis.call('SET', key, old, 'PX', px)
  return 'other'
end

-- How long an outcome is kept: `ttl`, except an expiry, which is not a result: it is
-- not kept, so that a later identical request (or a waiter whose own deadline has not
-- passed, submitting again) starts afresh instead of reading "expired" from the cache.
local function outcome_ttl(outcome, ttl)
  if string.byte(outcome, 1) == 88 then return 0 end -- 'X'
  return ttl
end

-- Queues `outcome` of `rid` for each producer in `waiters` (sent by `flush_replies`,
-- which every script calls last).
local function queue_replies(rid, outcome, waiters)
  for _, w in ipairs(waiters) do
    if w ~= '' then
      local flat = replies[w]
      if not flat then
        flat = {}
        replies[w] = flat
      end
      flat[#flat + 1] = rid
      flat[#flat + 1] = outcome
    end
  end
end

-- Resolves request `rid` (held by stream entry `sid`) with `outcome`. Callers have
-- acknowledged `sid` already (or it was never delivered), so this is the entry's one
-- outcome. Indexed requests (dedup on) go through `settle`; requests without an index
-- have one waiter, `from`, and no stored outcome. Returns the number of producers told.
local function finish(reqp, rid, sid, from, indexed, outcome, ttl, now, grace)
  if rid == nil or rid == '' then return 0 end
  local waiters = { from or '' }
  if indexed == '1' then
    local status, w = settle(reqp .. rid, sid, outcome, outcome_ttl(outcome, ttl), now, grace)
    if status == 'won' then
      waiters = w
    elseif status == 'other' then
      return 0
    end
  end
  queue_replies(rid, outcome, waiters)
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
  return finish(reqp, f['rid'], sid, f['from'], f['index'], 'D' .. reason, ttl, tonumber(now), ttl)
end
