-- nitro_verify.lua: which of a producer's requests still exist: the entry is in the
-- stream or pending, or an answer key is there. One that has none of them was lost with
-- the stream (deleted, flushed, a restart without persistence) and will never be
-- answered. An answer writes its key before or with the XDEL, so a request answered
-- meanwhile is never taken for lost.
-- KEYS[1] stream   KEYS[2] result key prefix   KEYS[3] error key prefix
-- ARGV[1] group   ARGV[2..] entry ids
-- Reply: per id 1 (exists or answered) or 0 (lost).
local stream, rp, ep, group = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local alive = 0
  if redis.call('EXISTS', rp .. id) == 1 or redis.call('EXISTS', ep .. id .. '.error') == 1 then
    alive = 1
  elseif #redis.call('XRANGE', stream, id, id) > 0 then
    alive = 1
  else
    local ok, p = pcall(redis.call, 'XPENDING', stream, group, id, id, 1)
    if ok and #p > 0 then alive = 1 end
  end
  out[#out + 1] = alive
end
return out
