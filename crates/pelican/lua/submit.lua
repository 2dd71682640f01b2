-- submit.lua: submit a batch of requests WITH dedup (one call for many requests).
-- KEYS[1] stream            P:{Q}:stream
-- KEYS[2] request prefix    P:{Q}:req:     (rid appended here; same hash tag)
-- KEYS[3] reply prefix      P:{Q}:reply:
-- ARGV[1] now (ms)   ARGV[2] producer id   ARGV[3] group
-- ARGV[4] result ttl (ms: also how long an index outlives its deadline)
-- ARGV[5] reply maxlen
-- ARGV[6] failure ttl (ms): how long a recorded failure (an outcome tagged E, the
--         handler's "fail") is served to a new submission; 0 = never, result ttl or more =
--         as long as it is recorded
-- ARGV[7..] sextuples: rid, deadline (ms), index ttl (ms: time to the deadline plus
--           result ttl, at least result ttl + 1), trace context ('' for none: no tp
--           field), stage, body.
--           stage '' : the body is the argument after it.
--           stage s  : the body was stored at body_key(q, s) by a SET sent just before
--                      this call (the body argument is empty): a new entry gets the
--                      field bref = "1" instead of a body, and the stored body is renamed
--                      to body_key(q, <its id>); otherwise the stored body is deleted.
-- Numbers are passed on to Redis as the strings they came in: Lua would format a number
-- with printf's %.17g, a real share of the server's time at high rates.
-- Reply: one string per request, in order:
--   "<sid>" (a digit first) queued as a new stream entry
--   "=" joined a request already in flight
--   an outcome ("O..", "E..", "D..", ...) the cached result of a finished request (a
--       failure "E.." only within the failure ttl of its recording: after that the
--       request runs again, its new index replacing the failure)
--   "!" its stored body is missing (the SET before this call failed): not submitted
--       (asked only of a request that needs a new entry: a join or a cached outcome
--       needs no body)
local q = { stream = KEYS[1], reqp = KEYS[2], replyp = KEYS[3], now = tonumber(ARGV[1]),
  group = ARGV[3], ttl = tonumber(ARGV[4]), maxlen = ARGV[5], fttl = tonumber(ARGV[6]) }
local ARGV = ARGV
local at, producer = ARGV[1], ARGV[2]
local out = {}
for i = 7, #ARGV, 6 do
  local rid, deadline, index_ttl, tp = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local stage, body = ARGV[i + 4], ARGV[i + 5]
  local bname, bvalue = 'body', body
  if stage ~= '' then bname, bvalue = 'bref', '1' end
  local answer
  local key = q.reqp .. rid
  local v = rpcall('GET', key)
  -- not a string: a foreign client's key, not ours; the SET below replaces it
  local foreign, sid, dl, waiters = false, nil, nil, nil
  if v then
    foreign = type(v) == 'table' and v.err
    if foreign then v = false else sid, dl, waiters = index_parse(v) end
  end
  if sid and dl < q.now then
    if stage ~= '' and rcall('EXISTS', body_key(q, stage)) == 0 then
      -- its SET failed (refused: maxmemory, a read-only replica): the caller is told, and
      -- the expired entry is left for a submission that brings its body
      answer = '!'
    else
      -- in flight but past its deadline: expire it so this submission starts afresh
      rcall('XACK', q.stream, q.group, sid)
      rcall('XDEL', q.stream, sid)
      rcall('DEL', body_key(q, sid))
      finish(q, sid, { rid = rid, index = '1' }, 'Xdeadline passed before the request was solved')
    end
  elseif sid then
    local more = index_add_waiter(waiters, producer)
    if more then rcall('APPEND', key, more) end
    answer = '='
  elseif v and is_outcome(v) then
    -- A failure ('E') is served only if recorded less than the failure ttl ago: outcomes
    -- are recorded with the result ttl as their ttl, so their age is the result ttl less
    -- what is left of it (the outcome's format stays as it is). An older one is replaced
    -- by the new entry's index below, and the request runs again.
    if byte(v, 1) ~= 69 or q.fttl >= q.ttl
        or (q.fttl > 0 and rcall('PTTL', key) > q.ttl - q.fttl) then
      answer = v
    end
  end
  -- anything else (no value, an expired one, a foreign client's): a new entry
  if not answer then
    local new
    local head = entry_head(rid, producer, deadline, at, '1')
    if tp == '' then
      new = rcall('XADD', q.stream, '*', 'head', head, bname, bvalue)
    else
      new = rcall('XADD', q.stream, '*', 'head', head, 'tp', tp, bname, bvalue)
    end
    -- RENAME fails when the staged body is missing (its SET failed: refused by maxmemory,
    -- a read-only replica): the new entry goes again and the caller is told. One call
    -- instead of an EXISTS before every new entry.
    local refused = stage ~= '' and rpcall('RENAME', body_key(q, stage), body_key(q, new)).err
    if refused then
      rcall('XDEL', q.stream, new)
      answer = '!'
    else
      local pending = index_pending(new, deadline, producer)
      if foreign then
        rcall('SET', key, pending, 'PX', index_ttl)
      else
        -- GET: the reply is the old value (a string or none), not a status, which Lua
        -- would get as a table of its own (GET refuses a key of another type: above)
        rcall('SET', key, pending, 'PX', index_ttl, 'GET')
      end
      answer = new
    end
  elseif stage ~= '' then
    rcall('DEL', body_key(q, stage))
  end
  out[#out + 1] = answer
end
flush_replies(q)
return out
