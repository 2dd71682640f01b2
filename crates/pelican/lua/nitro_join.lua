-- nitro_join.lua: dedup of entries just read or reclaimed: each one either solves its
-- body (starts or takes over the body's job), joins the job that is being solved, or is
-- answered from the cache.
-- KEYS[1] stream   KEYS[2] dedup job prefix   KEYS[3] dedup cache prefix
-- KEYS[4] result key prefix (`result-key:<stream>.`)
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] idletime (ms)   ARGV[4] job TTL (ms)
-- ARGV[5] answer key TTL (ms; 0 = none)   ARGV[6..] pairs: entry id, body hash
-- Reply: per pair 's' (run the handler), 'j' (joined), 'c' (answered from the cache),
--        'g' (not this consumer's any more: leave it).
-- A job (`<job prefix><hash>`, a hash) names its solver entry and the consumer that
-- holds it (`solver`, `owner`); every joiner is a field `<entry id>` = 'j'. A joiner is
-- handed to the owner (XCLAIM JUSTID: the delivery count stays), whose lease renewal
-- keeps it non-idle with the solver and whose answer answers it. An entry joins only a
-- live job: solver pending, held by the job's owner, idle below idletime. Otherwise it
-- becomes the solver itself (the owner died, released it, or a consumer that knows
-- nothing of dedup took the solver over); the joiners listed stay, and are answered with
-- whatever solves the job first.
local stream, jobp, cachep, rp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, me, idle, job_ttl, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local out = {}
for i = 6, #ARGV, 2 do
  local id, hash = ARGV[i], ARGV[i + 1]
  local p = pending_one(stream, group, id)
  local verdict
  if not p or p[2] ~= me then
    verdict = 'g'
  else
    local cached = redis.call('GET', cachep .. hash)
    if cached then
      answer_entry(stream, group, id, rp .. id, cached, ttl)
      verdict = 'c'
    else
      local job = jobp .. hash
      local solver, owner = unpack(redis.call('HMGET', job, 'solver', 'owner'))
      if solver and solver ~= id then
        local s = pending_one(stream, group, solver)
        if s and s[2] == owner and tonumber(s[3]) < idle then
          if owner ~= me then
            redis.call('XCLAIM', stream, group, owner, 0, id, 'JUSTID')
          end
          redis.call('HSET', job, id, 'j')
          redis.call('PEXPIRE', job, job_ttl)
          verdict = 'j'
        end
      end
      if not verdict then
        redis.call('HSET', job, 'solver', id, 'owner', me)
        redis.call('HDEL', job, id)
        redis.call('PEXPIRE', job, job_ttl)
        verdict = 's'
      end
    end
  end
  out[#out + 1] = verdict
end
return out
