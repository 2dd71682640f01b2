-- requeue.lua: put dead letters back on the queue as fresh requests.
-- KEYS[1] stream   KEYS[2] dead-letter stream   KEYS[3] request prefix
-- ARGV[1] now (ms)   ARGV[2] new deadline (ms)
-- ARGV[3] result ttl (ms: how long a new index outlives the deadline)
-- ARGV[4..] dead-letter ids
-- Reply: flat list of dead-letter id, new stream id ("" when the id was not found or the
-- entry had no body to requeue).
-- The original request id, producer, index flag and body are kept (written in the
-- entry's head, docs/PROTOCOL.md "Entries"), the deadline is renewed and
-- the delivery count starts again. An indexed request gets a fresh index with no
-- waiters (the dead outcome cached for it is replaced), unless the same rid is in
-- flight again already: that entry's outcome is then cached for whoever asks again.
-- All of a letter's work or none of it: everything that can fail on a key's contents is
-- read before the first write (a request key of another type, a foreign client's, is
-- replaced like any value that is not a pending index), so a second requeue of the same
-- letter can never queue it twice.
local stream, dead, reqp = KEYS[1], KEYS[2], KEYS[3]
local now, deadline, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local px = tonumber(deadline) - tonumber(now) + ttl
local q = { stream = stream }
local out = {}
for i = 4, #ARGV do
  local did = ARGV[i]
  local r = redis.call('XRANGE', dead, did, did)
  local sid = ''
  if r[1] then
    local f = fields_map(r[1][2])
    -- a stored body (lib.lua) goes with the new entry; gone (its ttl passed), there is
    -- nothing to requeue
    local stored = f['bref'] == '1'
    local bkey = body_key(q, 'd' .. did)
    if f['body'] or (stored and redis.call('EXISTS', bkey) == 1) then
      local rid = f['rid'] or ''
      local indexed = f['index'] or '0'
      local fresh = false
      if indexed == '1' and rid ~= '' then
        local cur = redis.pcall('GET', reqp .. rid)
        fresh = not index_parse(cur)
      end
      local head = entry_head(rid, f['from'] or '', deadline, now, indexed)
      if stored then
        sid = redis.call('XADD', stream, '*', 'head', head, 'bref', '1')
        redis.call('RENAME', bkey, body_key(q, sid))
        redis.call('PEXPIRE', body_key(q, sid), px)
      else
        sid = redis.call('XADD', stream, '*', 'head', head, 'body', f['body'])
      end
      if fresh then
        redis.call('SET', reqp .. rid, index_pending(sid, deadline), 'PX', px)
      end
      redis.call('XDEL', dead, did)
    end
  end
  out[#out + 1] = did
  out[#out + 1] = sid
end
return out
