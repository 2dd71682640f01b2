-- submit.lua: submit a batch of requests WITH dedup (one call for many requests).
-- KEYS[1] stream            P:{Q}:stream
-- KEYS[2] request prefix    P:{Q}:req:     (rid appended here; same hash tag)
-- KEYS[3] reply prefix      P:{Q}:reply:
-- ARGV[1] now (ms)   ARGV[2] producer id   ARGV[3] group
-- ARGV[4] result ttl (ms: also how long an index outlives its deadline)
-- ARGV[5] reply maxlen
-- ARGV[6..] quadruples: rid, deadline (ms), index ttl (ms: time to the deadline plus
--           result ttl, at least result ttl + 1), body
-- Numbers are passed on to Redis as the strings they came in: Lua would format a number
-- with printf's %.17g, a real share of the server's time at high rates.
-- Reply: one string per request, in order:
--   "+<sid>" queued as a new stream entry   "=" joined a request already in flight
--   an outcome ("O..", "E..", "D..", "X..") the cached result of a finished request
local stream, reqp, replyp = KEYS[1], KEYS[2], KEYS[3]
local now, producer, group = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local grace, maxlen = tonumber(ARGV[4]), ARGV[5]
local out = {}
for i = 6, #ARGV, 4 do
  local rid, deadline, index_ttl, body = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local key = reqp .. rid
  local v = redis.pcall('GET', key)
  -- not a string: a foreign client's key, not ours; the SET below replaces it
  if type(v) == 'table' and v.err then v = false end
  if v and string.sub(v, 1, 1) == 'P' then
    local sid, dl = string.match(v, '^P([^;]*);([^;]*);')
    if tonumber(dl) and tonumber(dl) < now then
      -- in flight but past its deadline: expire it so this submission starts afresh
      redis.call('XACK', stream, group, sid)
      redis.call('XDEL', stream, sid)
      finish(reqp, rid, sid, nil, '1', 'Xdeadline passed before the request was solved', 0, now, grace)
      v = nil
    end
  end
  if v and string.sub(v, 1, 1) == 'P' then
    if not string.find(v, ';' .. producer .. ';', 1, true) then
      redis.call('APPEND', key, producer .. ';')
    end
    out[#out + 1] = '='
  elseif v then
    out[#out + 1] = v
  else
    local sid = redis.call('XADD', stream, '*', 'rid', rid, 'from', producer, 'deadline', deadline,
      'at', ARGV[1], 'index', '1', 'body', body)
    redis.call('SET', key, 'P' .. sid .. ';' .. deadline .. ';' .. producer .. ';', 'PX', index_ttl)
    out[#out + 1] = '+' .. sid
  end
end
flush_replies(replyp, maxlen)
return out
