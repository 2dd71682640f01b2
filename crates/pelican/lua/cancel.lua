-- cancel.lua: a producer stops waiting for some requests. A request nobody waits for
-- any more is withdrawn: its entry is acknowledged and deleted (a consumer working on
-- it loses its lease and its outcome is dropped) and its index removed.
-- KEYS[1] stream   KEYS[2] request prefix
-- ARGV[1] group   ARGV[2] producer   ARGV[3..] pairs: rid, stream id ("" when indexed)
-- Reply: the number of requests withdrawn.
local stream, reqp, group, producer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local withdrawn = 0
for i = 3, #ARGV, 2 do
  local rid, sid = ARGV[i], ARGV[i + 1]
  if sid ~= '' then
    redis.call('XACK', stream, group, sid)
    withdrawn = withdrawn + redis.call('XDEL', stream, sid)
  else
    local key = reqp .. rid
    local v = redis.pcall('GET', key)
    if type(v) == 'table' and v.err then v = false end -- a foreign key of another type
    local entry = index_parse(v)
    if entry then
      local nv, waited = index_remove_waiter(v, producer)
      if not waited then
        redis.call('XACK', stream, group, entry)
        redis.call('XDEL', stream, entry)
        redis.call('DEL', key, body_key({ stream = stream }, entry))
        withdrawn = withdrawn + 1
      elseif nv ~= v then
        redis.call('SET', key, nv, 'KEEPTTL')
      end
    end
  end
end
if withdrawn > 0 then trim_finished({ stream = stream, group = group }) end
return withdrawn
