-- nitro_trim.lua: the producer's stream housekeeping: XTRIM MINID below the oldest
-- pending entry, as Nitro's producers do (so both can run on one stream), and with
-- nothing pending, up to the last delivered entry. Never trims a pending or undelivered
-- entry. Unlike Nitro's producers, it reaps nobody's requests: a pelican producer
-- withdraws only its own, at its own timeout.
-- KEYS[1] stream
-- ARGV[1] group
-- Reply: the number of entries trimmed.
local stream, group = KEYS[1], ARGV[1]
if redis.call('EXISTS', stream) == 0 then return 0 end
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
if not ok then return 0 end
local last, pending
for _, g in ipairs(groups) do
  local m = {}
  for i = 1, #g, 2 do m[g[i]] = g[i + 1] end
  if m['name'] == group then last, pending = m['last-delivered-id'], tonumber(m['pending']) end
end
if not last then return 0 end
local minid
if pending > 0 then
  minid = redis.call('XPENDING', stream, group)[2]
else
  -- just past the last delivered entry (a sequence too large for Lua's numbers stops
  -- at the entry itself)
  local ms, seq = string.match(last, '^(%d+)-(%d+)$')
  if seq and tonumber(seq) < 2 ^ 53 then
    minid = ms .. '-' .. (tonumber(seq) + 1)
  else
    minid = last
  end
end
return redis.call('XTRIM', stream, 'MINID', minid)
