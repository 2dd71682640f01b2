-- forget.lua: a producer found the stored answer an outcome names gone from Redis
-- (evicted under maxmemory, lost in a restart, deleted by hand). The outcome is
-- forgotten, so the request is submitted afresh instead of answered from it again.
-- KEYS[1] the request's index key
-- ARGV[1] the outcome, as the producer read it
-- Reply: 1 = forgotten; 0 = the index holds something else (forgotten already by another
--        waiter, in flight again, or not a string): left as it is.
local v = redis.pcall('GET', KEYS[1])
if v == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
