-- nitro_reclaim.lua: take over entries idle for the agreed idletime (their consumer died,
-- or handed them back), as Nitro's XPENDING IDLE + XAUTOCLAIM do, in one call.
-- KEYS[1] stream
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] idletime (ms)   ARGV[4] most entries to take
-- Reply: { flat list of entry id, delivery count before this claim; the entries as XCLAIM
--        returns them }
-- XCLAIM with min-idle = idletime counts one more delivery, as XAUTOCLAIM does. Entries
-- deleted from the stream while pending are dropped from the pending list by XCLAIM
-- (Redis 7) and not returned.
local stream, group, me, idle, count = KEYS[1], ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local pend = redis.call('XPENDING', stream, group, 'IDLE', idle, '-', '+', count)
if #pend == 0 then return { {}, {} } end
local ids, counts = {}, {}
for _, e in ipairs(pend) do
  ids[#ids + 1] = e[1]
  counts[#counts + 1] = e[1]
  counts[#counts + 1] = e[4]
end
return { counts, redis.call('XCLAIM', stream, group, me, idle, unpack(ids)) }
