-- reject.lua: dead-letter one delivered entry that cannot be handled (missing fields,
-- undecodable or oversized body) and tell its waiters, if it names any.
-- KEYS[1] stream   KEYS[2] dead-letter stream   KEYS[3] request prefix   KEYS[4] reply prefix
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] stream id   ARGV[4] reason   ARGV[5] deliveries
-- ARGV[6] now (ms)   ARGV[7] result ttl (ms)   ARGV[8] reply maxlen   ARGV[9] dead-letter maxlen
-- ARGV[10] max body bytes (longer values are not copied to the dead letter)
-- Reply: 1 if it was dead-lettered, 0 if it was no longer pending (someone else finished it).
local q = { stream = KEYS[1], dead = KEYS[2], reqp = KEYS[3], replyp = KEYS[4],
  group = ARGV[1], now = tonumber(ARGV[6]), ttl = tonumber(ARGV[7]), maxlen = ARGV[8],
  dead_maxlen = ARGV[9], max_body = tonumber(ARGV[10]) }
local sid = ARGV[3]
local p = redis.call('XPENDING', q.stream, q.group, sid, sid, 1)
if #p == 0 then return 0 end
local r = redis.call('XRANGE', q.stream, sid, sid)
local flat = nil
if r[1] then flat = r[1][2] end
bury(q, { sid = sid, fields = flat, reason = ARGV[4], deliveries = ARGV[5], consumer = ARGV[2] })
trim_finished(q)
flush_replies(q)
return 1
