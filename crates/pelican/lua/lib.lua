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
--   reply entry  on "replyp" .. producer: rid <rid> out <outcome>.

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

-- Resolves request `rid` (held by stream entry `sid`) with `outcome`: stores the
-- outcome for `ttl` ms and pushes it to the reply stream of every waiting
-- producer. Only the request key that still points at `sid` is touched, so a
-- late outcome of an older entry cannot clobber a newer request with the same rid.
-- Returns the number of producers told.
local function finish(reqp, replyp, rid, sid, from, indexed, outcome, ttl, maxlen)
  local waiters = {}
  if rid == nil or rid == '' then return 0 end
  local key = reqp .. rid
  if indexed == '1' then
    local v = redis.call('GET', key)
    local head = 'P' .. sid .. ';'
    if v and string.sub(v, 1, #head) == head then
      waiters = pending_waiters(v)
      if ttl > 0 then
        redis.call('SET', key, outcome, 'PX', ttl)
      else
        redis.call('DEL', key)
      end
    elseif not v and from and from ~= '' then
      -- the index expired before the work was done; its submitter may still wait
      waiters[1] = from
    end
  else
    if from and from ~= '' then waiters[1] = from end
    if ttl > 0 then redis.call('SET', key, outcome, 'PX', ttl) end
  end
  for _, w in ipairs(waiters) do
    -- NOMKSTREAM: a producer whose reply stream expired is gone; do not recreate it.
    redis.call('XADD', replyp .. w, 'NOMKSTREAM', 'MAXLEN', '~', maxlen, '*', 'rid', rid, 'out', outcome)
  end
  return #waiters
end

-- Moves stream entry `sid` (fields `flat`) to the dead-letter stream with
-- `reason`, acknowledges and deletes it, and tells its waiters.
local function bury(stream, dead, reqp, replyp, group, sid, flat, reason, deliveries, consumer, now, ttl, maxlen, dead_maxlen)
  local args = { 'XADD', dead, 'MAXLEN', '~', dead_maxlen, '*',
    'entry', sid, 'reason', reason, 'deliveries', deliveries, 'consumer', consumer, 'dead_at', now }
  if flat then
    for i = 1, #flat do args[#args + 1] = flat[i] end
  end
  redis.call(unpack(args))
  redis.call('XACK', stream, group, sid)
  redis.call('XDEL', stream, sid)
  local f = fields_map(flat)
  return finish(reqp, replyp, f['rid'], sid, f['from'], f['index'], 'D' .. reason, ttl, maxlen)
end
