-- reject.lua: dead-letter one delivered entry that cannot be handled (missing fields,
-- undecodable or oversized body) and tell its waiters, if it names any.
-- KEYS[1] stream   KEYS[2] dead-letter stream   KEYS[3] request prefix   KEYS[4] reply prefix
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] stream id   ARGV[4] reason   ARGV[5] deliveries
-- ARGV[6] now (ms)   ARGV[7] result ttl (ms)   ARGV[8] reply maxlen   ARGV[9] dead-letter maxlen
-- ARGV[10] max body bytes (longer values are not copied to the dead letter)
-- Reply: 1 if it was dead-lettered, 0 if it was no longer pending (someone else finished it).
local stream, dead, reqp, replyp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer, sid, reason, deliveries = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now, ttl, maxlen, dead_maxlen = ARGV[6], tonumber(ARGV[7]), ARGV[8], ARGV[9]
local max_body = tonumber(ARGV[10])
local p = redis.call('XPENDING', stream, group, sid, sid, 1)
if #p == 0 then return 0 end
local r = redis.call('XRANGE', stream, sid, sid)
local flat = nil
if r[1] then flat = r[1][2] end
bury(stream, dead, reqp, replyp, group, sid, flat, reason, deliveries, consumer, now, ttl, maxlen, dead_maxlen, max_body)
flush_replies(replyp, maxlen)
return 1
