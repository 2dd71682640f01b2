-- nitro_answer.lua: write a batch of answers, each atomically: answer key, XACK, XDEL.
-- KEYS[1] stream   KEYS[2] result key prefix (`result-key:<stream>.`)
-- KEYS[3] error key prefix (`error-key:<stream>.`)   KEYS[4] dedup job prefix
-- KEYS[5] dedup cache prefix
-- ARGV[1] group   ARGV[2] answer key TTL (ms; 0 = none)   ARGV[3] cache TTL (ms; 0 = none)
-- ARGV[4..] quintuples: entry id, body hash ('' = not deduplicated), mode, kind, value
--   mode 'h': the handler's answer: with a hash, it answers every entry of the dedup job
--             (the solver and its joiners, whoever holds them) and ends the job.
--   mode 'r': the retry limit's error: it ends the job only if this entry is its solver;
--             a joiner is answered alone and leaves the job.
--   kind 'r' result (JSON) or 'e' error (plain text).
-- Reply: per quintuple { 1 if this entry was answered (0: it was not pending any more,
--        the answer is dropped), number of other entries of its job answered }.
local stream, rp, ep, jobp, cachep = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, ttl, cache_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV, 5 do
  local id, hash, mode, kind, value = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local mine = answer_entry(stream, group, id, answer_key(rp, ep, id, kind), value, ttl)
  local others = 0
  if hash ~= '' then
    local job = jobp .. hash
    local solver = redis.call('HGET', job, 'solver')
    if mode == 'h' or solver == id then
      for _, other in ipairs(job_entries(job, id)) do
        others = others + answer_entry(stream, group, other, answer_key(rp, ep, other, kind), value, ttl)
      end
      redis.call('DEL', job)
      if mode == 'h' and kind == 'r' and cache_ttl > 0 then
        redis.call('SET', cachep .. hash, value, 'PX', cache_ttl)
      end
    else
      redis.call('HDEL', job, id)
    end
  end
  out[#out + 1] = { mine, others }
end
return out
