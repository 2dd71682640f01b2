-- complete.lua: record the outcomes of a batch of delivered entries (first outcome wins).
-- KEYS[1] stream   KEYS[2] request prefix   KEYS[3] reply prefix
-- ARGV[1] group   ARGV[2] result ttl (ms)   ARGV[3] reply maxlen
-- ARGV[4..] quintuples: stream id, rid, from (producer), index flag ("1"/"0"), outcome
-- Reply: one integer per entry: 1 = this outcome was recorded and pushed to the waiters,
--        0 = the entry was no longer pending (finished, cancelled or dead already): dropped.
-- XACK is the gate: it answers 1 only for the first acknowledgement of a pending entry.
local stream, reqp, replyp = KEYS[1], KEYS[2], KEYS[3]
local group, ttl, maxlen = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out, won = {}, {}
for i = 4, #ARGV, 5 do
  if redis.call('XACK', stream, group, ARGV[i]) == 1 then
    out[#out + 1] = 1
    won[#won + 1] = i
  else
    out[#out + 1] = 0
  end
end
-- one XDEL for the whole batch
for j = 1, #won, 500 do
  local ids = {}
  for k = j, math.min(j + 499, #won) do ids[#ids + 1] = ARGV[won[k]] end
  redis.call('XDEL', stream, unpack(ids))
end
for _, i in ipairs(won) do
  finish(reqp, replyp, ARGV[i + 1], ARGV[i], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ttl, maxlen)
end
flush_replies(replyp, maxlen)
return out
