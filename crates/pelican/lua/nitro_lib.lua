-- nitro_lib.lua: helpers of the Nitro-format scripts, prepended to those that use them.

-- Sets an answer key the way Nitro's consumer does: SET NX with `EX <s>` when the TTL is
-- a whole number of seconds, `PX <ms>` otherwise, no expiry when it is 0.
local function put_answer(key, value, ttl_ms)
  if ttl_ms >= 1000 and ttl_ms % 1000 == 0 then
    redis.call('SET', key, value, 'NX', 'EX', ttl_ms / 1000)
  elseif ttl_ms > 0 then
    redis.call('SET', key, value, 'NX', 'PX', ttl_ms)
  else
    redis.call('SET', key, value, 'NX')
  end
end

-- The answer key of entry `id`: `<result prefix><id>` for a result ('r'),
-- `<error prefix><id>.error` for an error ('e').
local function answer_key(result_prefix, error_prefix, id, kind)
  if kind == 'r' then return result_prefix .. id end
  return error_prefix .. id .. '.error'
end

-- The pending-list record of one entry: { id, owner, idle ms, deliveries }, or nil (also
-- when the stream or the group is gone).
local function pending_one(stream, group, id)
  local ok, p = pcall(redis.call, 'XPENDING', stream, group, id, id, 1)
  if not ok then return nil end
  return p[1]
end

-- The entries of a dedup job other than `except`: its solver and its joiners.
local function job_entries(job, except)
  local f = redis.call('HGETALL', job)
  local ids = {}
  for j = 1, #f, 2 do
    local field, v = f[j], f[j + 1]
    if field == 'solver' then
      if v ~= except then ids[#ids + 1] = v end
    elseif field ~= 'owner' and v == 'j' and field ~= except then
      ids[#ids + 1] = field
    end
  end
  return ids
end

-- Answers entry `id` if it is still pending (whoever holds it): the key (SET NX: an
-- existing key is kept, Nitro's consumer may have written it before dying), XACK, XDEL.
-- An entry that is no longer pending was answered (or withdrawn) already: nothing is
-- written, so no key is left that nobody will read. Returns 1 if it answered.
local function answer_entry(stream, group, id, key, value, ttl_ms)
  if redis.call('XACK', stream, group, id) == 0 then return 0 end
  put_answer(key, value, ttl_ms)
  redis.call('XDEL', stream, id)
  return 1
end
