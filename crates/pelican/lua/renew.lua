-- renew.lua: keep this consumer's leases alive, only for entries it still owns.
-- KEYS[1] stream
-- ARGV[1] group   ARGV[2] consumer   ARGV[3..] stream ids this consumer is working on
-- Reply: the ids it no longer owns (reclaimed by another consumer, finished or cancelled).
-- XCLAIM ... JUSTID resets the idle time without counting a delivery.
-- Ownership is asked of each id alone (XPENDING id id 1 consumer): a page of the
-- consumer's pending list from its oldest entry misses ids when the list is longer than
-- the page (entries whose outcomes are being written, entries read and not yet handed
-- out), and those were reported lost although they were not.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local keep, lost = {}, {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if #redis.call('XPENDING', stream, group, id, id, 1, consumer) > 0 then
    keep[#keep + 1] = id
  else
    lost[#lost + 1] = id
  end
end
for i = 1, #keep, 1000 do
  local chunk = { unpack(keep, i, math.min(i + 999, #keep)) }
  chunk[#chunk + 1] = 'JUSTID'
  redis.call('XCLAIM', stream, group, consumer, 0, unpack(chunk))
end
return lost
