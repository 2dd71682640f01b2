-- release.lua: hand entries back so any consumer can take them at once (shutdown,
-- retry, a dropped delivery). Only entries this consumer still owns are touched.
-- KEYS[1] stream
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] idle to set (ms; claim_idle = reclaimable now,
-- less = reclaimable after the difference)   ARGV[4..] stream ids, or none for "all I own"
-- Reply: the number of entries released.
-- XCLAIM ... IDLE backdates the entry; JUSTID leaves the delivery count alone (the
-- delivery that is being given up was counted when it was read).
local stream, group, consumer, idle = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local ids = {}
if #ARGV > 3 then
  local owned = {}
  local p = redis.call('XPENDING', stream, group, '-', '+', (#ARGV - 3) * 2 + 16, consumer)
  for _, e in ipairs(p) do owned[e[1]] = true end
  for i = 4, #ARGV do
    if owned[ARGV[i]] then ids[#ids + 1] = ARGV[i] end
  end
else
  local p = redis.call('XPENDING', stream, group, '-', '+', 100000, consumer)
  for _, e in ipairs(p) do ids[#ids + 1] = e[1] end
end
for i = 1, #ids, 1000 do
  local chunk = { unpack(ids, i, math.min(i + 999, #ids)) }
  chunk[#chunk + 1] = 'IDLE'
  chunk[#chunk + 1] = idle
  chunk[#chunk + 1] = 'JUSTID'
  redis.call('XCLAIM', stream, group, consumer, 0, unpack(chunk))
end
return #ids
