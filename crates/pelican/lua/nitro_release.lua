-- nitro_release.lua: hand entries back so that any consumer (Nitro's too) reclaims them at
-- once: `XCLAIM ... IDLE <ms> JUSTID`, owner-checked. JUSTID keeps the delivery count, so
-- a graceful stop or a retry is not counted as one more delivery (Nitro's hand-back is).
-- KEYS[1] stream
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] idle to set (ms: the idletime = reclaimable
-- now, less = after the difference)   ARGV[4] '1': leave the group if this consumer owns
-- nothing (only with no ids)   ARGV[5..] entry ids, or none for "everything it owns"
-- Reply: the number of entries released.
local stream, group, me, idle, leave = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'
local ids = {}
if #ARGV > 4 then
  for i = 5, #ARGV do
    local p = pending_one(stream, group, ARGV[i])
    if p and p[2] == me then ids[#ids + 1] = ARGV[i] end
  end
else
  local start = '-'
  while true do
    local ok, p = pcall(redis.call, 'XPENDING', stream, group, 'IDLE', 0, start, '+', 1000, me)
    if not ok then return 0 end -- the stream or the group is gone: nothing to hand back
    for _, e in ipairs(p) do ids[#ids + 1] = e[1] end
    if #p < 1000 then break end
    start = '(' .. p[#p][1]
  end
end
for i = 1, #ids, 1000 do
  local chunk = { unpack(ids, i, math.min(i + 999, #ids)) }
  chunk[#chunk + 1] = 'IDLE'
  chunk[#chunk + 1] = idle
  chunk[#chunk + 1] = 'JUSTID'
  redis.call('XCLAIM', stream, group, me, 0, unpack(chunk))
end
if leave and #ARGV == 4 and #ids == 0 then
  pcall(redis.call, 'XGROUP', 'DELCONSUMER', stream, group, me)
end
return #ids
