-- complete.lua: record the outcomes of a batch of delivered entries (first outcome wins).
-- KEYS[1] stream   KEYS[2] request prefix   KEYS[3] reply prefix
-- ARGV[1] group   ARGV[2] result ttl (ms)   ARGV[3] reply maxlen
-- ARGV[4..] quintuples: stream id, rid, from (producer), index flag ("1"/"0"), outcome
-- Reply: one integer per entry: 1 = this outcome was recorded and pushed to the waiters,
--        0 = the entry was no longer pending (finished, cancelled or dead already): dropped.
-- XACK is the gate: it answers 1 only for the first acknowledgement of a pending entry.
local stream, reqp, replyp = KEYS[1], KEYS[2], KEYS[3]
local group, ttl, maxlen = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out = {}
for i = 4, #ARGV, 5 do
  local sid, rid, from, indexed, outcome = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  if redis.call('XACK', stream, group, sid) == 1 then
    redis.call('XDEL', stream, sid)
    finish(reqp, replyp, rid, sid, from, indexed, outcome, ttl, maxlen)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
