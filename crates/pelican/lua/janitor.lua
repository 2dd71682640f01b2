-- janitor.lua: keep a queue's memory bounded. Safe to run from many processes: a lock
-- key lets one run per interval; every step is idempotent.
-- KEYS[1] stream   KEYS[2] request prefix   KEYS[3] reply prefix   KEYS[4] lock key
-- ARGV[1] group   ARGV[2] now (ms)   ARGV[3] interval (ms, lock lifetime)   ARGV[4] runner id
-- ARGV[5] consumer gc after (ms)   ARGV[6] result ttl (ms)   ARGV[7] reply maxlen
-- ARGV[8] how many undelivered entries to check for expiry
-- Reply: { ran (0/1), entries trimmed, entries expired, consumers removed }
-- Steps: 1. XTRIM MINID below the oldest pending entry (never below: XTRIM removes pending
-- entries and would leave dangling PEL references) and never past the last delivered
-- entry; 2. undelivered entries past their deadline are deleted and their waiters told
-- "expired"; 3. consumers that own nothing and were idle longer than the gc age leave.
local q = { stream = KEYS[1], reqp = KEYS[2], replyp = KEYS[3], group = ARGV[1],
  now = tonumber(ARGV[2]), ttl = tonumber(ARGV[6]), maxlen = ARGV[7] }
local stream, group, now, lock = q.stream, q.group, q.now, KEYS[4]
local interval, runner, gc_after, scan = ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[8])
if not redis.call('SET', lock, runner, 'NX', 'PX', interval) then
  -- Held: by a run within the interval, unless it never expires. Then it is not a lock
  -- of ours but a foreign client's key (of any type), which would stop every run for
  -- good: take it over.
  if redis.call('PTTL', lock) ~= -1 then return { 0, 0, 0, 0 } end
  redis.call('SET', lock, runner, 'PX', interval)
end
if redis.call('EXISTS', stream) == 0 then return { 1, 0, 0, 0 } end

local last, pending = nil, 0
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local m = fields_map(g)
  if m['name'] == group then
    last, pending = m['last-delivered-id'], tonumber(m['pending'])
  end
end
if not last then return { 1, 0, 0, 0 } end

-- 1. trim
local trimmed = 0
local minid
if pending > 0 then
  minid = redis.call('XPENDING', stream, group)[2]
else
  minid = id_after(last)
end
trimmed = redis.call('XTRIM', stream, 'MINID', minid)

-- 2. expire undelivered entries past their deadline. Only well-formed ones: a malformed
-- entry (no rid, no body, a deadline that is not a number of ms) is left to a consumer,
-- which dead-letters it with the reason instead of letting it vanish.
local expired = 0
local entries = redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', scan)
for _, e in ipairs(entries) do
  local f = fields_map(e[2])
  local dl = f['deadline'] and string.match(f['deadline'], '^%d+$') and tonumber(f['deadline'])
  if dl and dl < now and f['rid'] and f['rid'] ~= '' and (f['body'] or f['bref'] == '1') then
    redis.call('XDEL', stream, e[1])
    if f['bref'] == '1' then redis.call('DEL', body_key(q, e[1])) end
    finish(q, e[1], f, 'Xdeadline passed before any consumer took the request')
    expired = expired + 1
  end
end

flush_replies(q)

-- 3. consumers that are gone
local removed = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
  local m = fields_map(c)
  if tonumber(m['pending']) == 0 and tonumber(m['idle']) > gc_after then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, m['name'])
    removed = removed + 1
  end
end
return { 1, trimmed, expired, removed }
