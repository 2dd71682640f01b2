-- nitro_gc.lua: remove consumers that own nothing and have been idle for a long time
-- (Nitro gives every process start a fresh name, and its producers' reapers add theirs;
-- nothing ever removes them). A consumer with pending entries is never removed: that
-- would drop its entries from the pending list. One that is alive and owns nothing
-- loses nothing: its next read registers it again.
-- KEYS[1] stream
-- ARGV[1] group   ARGV[2] idle after which an empty consumer is removed (ms)
-- ARGV[3] the caller's own name (kept)
-- Reply: the number of consumers removed.
local stream, group, after, me = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('EXISTS', stream) == 0 then return 0 end
local ok, cs = pcall(redis.call, 'XINFO', 'CONSUMERS', stream, group)
if not ok then return 0 end
local removed = 0
for _, c in ipairs(cs) do
  local m = {}
  for i = 1, #c, 2 do m[c[i]] = c[i + 1] end
  if m['name'] ~= me and tonumber(m['pending']) == 0 and tonumber(m['idle']) > after then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, m['name'])
    removed = removed + 1
  end
end
return removed
