-- watch.lua: a producer waits on a request by its id without submitting it (a caller
-- that comes back for the answer to a request submitted earlier, by this process or
-- another: the gateway's asynchronous form). Needs the request's index (dedup on).
-- KEYS[1] request key   P:{Q}:req:<rid>
-- ARGV[1] producer id
-- Reply:
--   an outcome ("O..", "A..", "E..", "D..")  finished: its recorded outcome, whatever it
--         is (a failure too, however long new submissions are answered with it)
--   "="   in flight: the producer now waits for it too (added to its waiters, once), and
--         its outcome is pushed to the producer's reply stream
--   ""    Redis knows nothing of it: never submitted, finished more than the result ttl
--         ago, expired, withdrawn, or submitted without an index
local key, producer = KEYS[1], ARGV[1]
local v = rpcall('GET', key)
-- none (false), or a key of another type (a foreign client's): unknown
if type(v) ~= 'string' then return '' end
local sid, _, waiters = index_parse(v)
if sid then
  local more = index_add_waiter(waiters, producer)
  if more then rcall('APPEND', key, more) end
  return '='
end
if is_outcome(v) then return v end
return ''
