-- nitro_renew.lua: the heartbeat: keep this consumer's entries non-idle, owner-checked.
-- KEYS[1] stream   KEYS[2] dedup job prefix
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] job TTL (ms)
-- ARGV[4..] pairs: entry id this consumer holds, its body hash ('' = not deduplicated)
-- Reply: the ids it no longer holds (another consumer took them over, or they were
--        answered or withdrawn): their handlers should stop.
-- Only entries still pending on this consumer get `XCLAIM ... JUSTID` (idle back to 0,
-- the delivery count stays): unlike Nitro's heartbeat, it never takes back an entry that
-- another consumer has reclaimed. For an entry that solves a dedup job, the job's
-- joiners held by this consumer are kept non-idle too, and the job's TTL refreshed.
local stream, jobp = KEYS[1], KEYS[2]
local group, me, job_ttl = ARGV[1], ARGV[2], ARGV[3]
local keep, lost = {}, {}
local function mine(id)
  local p = pending_one(stream, group, id)
  return p and p[2] == me
end
for i = 4, #ARGV, 2 do
  local id, hash = ARGV[i], ARGV[i + 1]
  if mine(id) then
    keep[#keep + 1] = id
    if hash ~= '' then
      local job = jobp .. hash
      local solver, owner = unpack(redis.call('HMGET', job, 'solver', 'owner'))
      if solver == id and owner == me then
        for _, joiner in ipairs(job_entries(job, id)) do
          if mine(joiner) then keep[#keep + 1] = joiner end
        end
        redis.call('PEXPIRE', job, job_ttl)
      end
    end
  else
    lost[#lost + 1] = id
  end
end
for i = 1, #keep, 1000 do
  local chunk = { unpack(keep, i, math.min(i + 999, #keep)) }
  chunk[#chunk + 1] = 'JUSTID'
  redis.call('XCLAIM', stream, group, me, 0, unpack(chunk))
end
return lost
