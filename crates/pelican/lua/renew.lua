-- renew.lua: keep this consumer's leases alive, only for entries it still owns.
-- KEYS[1] stream
-- ARGV[1] group   ARGV[2] consumer   ARGV[3..] stream ids this consumer is working on
-- Reply: the ids it no longer owns (reclaimed by another consumer, finished or cancelled).
-- XCLAIM ... JUSTID resets the idle time without counting a delivery.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local owned = {}
local p = redis.call('XPENDING', stream, group, '-', '+', (#ARGV - 2) * 2 + 16, consumer)
for _, e in ipairs(p) do owned[e[1]] = true end
local keep, lost = {}, {}
for i = 3, #ARGV do
  if owned[ARGV[i]] then keep[#keep + 1] = ARGV[i] else lost[#lost + 1] = ARGV[i] end
end
for i = 1, #keep, 1000 do
  local chunk = { unpack(keep, i, math.min(i + 999, #keep)) }
  chunk[#chunk + 1] = 'JUSTID'
  redis.call('XCLAIM', stream, group, consumer, 0, unpack(chunk))
end
return lost
