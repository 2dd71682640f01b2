-- complete.lua: record the outcomes of a batch of delivered entries (first outcome wins).
-- KEYS[1] stream   KEYS[2] request prefix   KEYS[3] reply prefix
-- ARGV[1] group   ARGV[2] result ttl (ms)   ARGV[3] reply maxlen   ARGV[4] now (ms)
-- ARGV[5..] sextuples: stream id, rid, from (producer), deadline (the entry's, in
--           digits; '' for an entry without an index: only an index is compared with
--           it), flags, outcome; the flags are
--           the index flag, "0" without an index, "1" with one, "2" with one and a stored
--           body (deleted with the entry: see lib.lua, "stored body"), then "t" when the
--           entry is small (its body, if in the entry, at most 1 KiB: it may be left in
--           the stream for a trim instead of its own XDEL, below) or "-", then "a" when
--           the outcome is a stored answer, "A<length>:<name>" (lib.lua, "stored
--           answer"): the response was SET at body_key(q, name) just before this call.
-- Reply: one integer per entry: 1 = this outcome was recorded and pushed to the waiters,
--        0 = the entry was finished, cancelled or dead already: this outcome is dropped
--            (and its stored answer deleted),
--        2 = its stored answer is not there (the SET before this call failed): nothing
--            was done; the caller writes it again.
-- The gate: for an indexed request, the index value itself (`settle` replaces the
-- pending state of this entry with the outcome in one SET ... GET; every other way an
-- entry ends also changes that value); without an index, or when the index expired,
-- XACK (it answers 1 only for the first acknowledgement of a pending entry).
-- The winners are then acknowledged with one XACK, and each producer gets one reply entry
-- for all its outcomes. Finished entries leave the stream in one of two ways:
-- - the trim below the oldest pending entry (lib.lua, trim_finished), which frees whole
--   listpack nodes without looking inside them;
-- - XDEL, which finds each entry by walking its node (10-20 % of Redis' work per request
--   when it was the only way): only for entries that are not small, or when the oldest
--   pending entry was submitted more than TRIM_WAIT_MS before the last one finished here
--   (work that runs long would hold back the trim; what piles up behind it is bounded by
--   the rate times TRIM_WAIT_MS times a small entry).
local q = { stream = KEYS[1], reqp = KEYS[2], replyp = KEYS[3], group = ARGV[1],
  ttl = tonumber(ARGV[2]), maxlen = ARGV[3], now = tonumber(ARGV[4]) }
local stream, group = q.stream, q.group
local ARGV = ARGV
local out, done, big, acks, bodies = {}, {}, {}, {}, {}
for i = 5, #ARGV, 6 do
  local sid, rid, from, deadline = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local flags, outcome = ARGV[i + 4], ARGV[i + 5]
  local index, small, stored = byte(flags, 1, 3) -- '0' = 48, '2' = 50, 't' = 116
  local won, waiters = false, nil -- nil: the one waiter is `from`
  local answer = stored and stored_answer_key(q, outcome)
  local missing = answer and rcall('EXISTS', answer) == 0
  if missing then
    -- nothing is done: the entry stays in the consumer's hands
  elseif index ~= 48 and rid ~= '' then
    local key = q.reqp .. rid
    -- the pending value as submit.lua writes it when its submitter alone waits
    local usual = 'P' .. sid .. ';' .. deadline .. ';' .. from .. ';'
    local status, w = settle(q, key, sid, outcome, usual)
    if status == 'won' then
      won, waiters = true, w
      acks[#acks + 1] = sid
    elseif status == 'gone' then
      if rcall('XACK', stream, group, sid) == 1 then
        won = true
      else
        rcall('DEL', key)
      end
    end
  elseif rcall('XACK', stream, group, sid) == 1 then
    won = true
  end
  if missing then
    out[#out + 1] = 2
  elseif won then
    done[#done + 1] = sid
    if small ~= 116 then big[#big + 1] = sid end
    if index == 50 then bodies[#bodies + 1] = body_key(q, sid) end
    if waiters then
      queue_replies(rid, outcome, waiters)
    else
      queue_reply(rid, outcome, from)
    end
    out[#out + 1] = 1
  else
    if answer then bodies[#bodies + 1] = answer end
    out[#out + 1] = 0
  end
end
for j = 1, #acks, 500 do
  rcall('XACK', stream, group, unpack(acks, j, math.min(j + 499, #acks)))
end
if #done > 0 then
  if trim_finished(q, done[#done]) then big = done end
  for j = 1, #big, 500 do
    rcall('XDEL', stream, unpack(big, j, math.min(j + 499, #big)))
  end
end
for j = 1, #bodies, 500 do
  rcall('DEL', unpack(bodies, j, math.min(j + 499, #bodies)))
end
flush_replies(q)
return out
