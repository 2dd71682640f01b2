-- lib.lua: helpers shared by the scripts; the first part of pelican's function library.
-- pelican loads its scripts as ONE library (FUNCTION LOAD): this file, then each script
-- file as the body of a function registered under its name (`register_function(name,
-- function(KEYS, ARGV) begin_call() <script> end)`: crates/pelican/src/protocol/
-- scripts/library.rs). This file's top level runs once, when the library is loaded, not
-- at every call, as it did when it was prepended to each script (~26k of Redis'
-- instructions per call, two calls per request: 13 % of a request's cost when requests
-- come one at a time).
--
-- Key names. The scripts receive the queue's key PREFIXES in KEYS ("P:{Q}:req:",
-- "P:{Q}:reply:") and append a request or producer id: declaring every key would take
-- one KEYS entry per request and per waiter. Every key built so carries the hash tag
-- {Q} of the keys declared, so a script touches one slot and Redis Cluster (which does
-- not check undeclared keys) runs it. A proxy that routes scripts by their declared
-- keys, or a server that enforces them, would not: see docs/PROTOCOL.md, "Scripts".
--
-- Vocabulary
--   q            the call: what a script got in KEYS and ARGV, as one table built once
--                per call (fields used here: stream, dead = keys; reqp, replyp = key
--                prefixes; group; now = ms, a number; ttl = result ttl in ms, a number:
--                how long an outcome is kept and how long an index outlives its
--                deadline; maxlen, dead_maxlen = caps of reply and dead-letter streams;
--                max_body = bytes, a number).
--   request key  q.reqp .. rid, a string: the index of the request (dedup on), either
--                pending: "P<stream id>;<deadline ms>;<producer>;<producer>;..."
--                         (the entry carrying it, its deadline in digits, then every
--                         waiting producer, each followed by ";"; none after a requeue),
--                or done: an outcome (below), kept for q.ttl.
--                Only the index_* helpers read or write the pending form; the Rust twin
--                is protocol/index.rs. Any other value (or a key of another type) is a
--                foreign client's: scripts replace it as if the key were absent.
--   outcome      a tag byte then a payload: "O"<response body> | "A"<length>:<name>
--                (a stored answer, below) | "E"<message of a remote error> |
--                "D"<dead-letter reason> | "X"<expiry note> | "C"<cancellation note>.
--   reply entry  on q.replyp .. producer: one or more pairs <rid> <outcome>; a script
--                pushes ONE entry per producer for all the outcomes it produced.
--   stored body  a large body (dedup on) is not a field of its entry: the entry has the
--                field bref = "1" and the body is the string at body_key(q, sid), or
--                body_key(q, 'd' .. dead id) once dead-lettered. Redis hashes every byte
--                of every string a script sees, so a body never passes through Lua: it
--                is written by a plain SET and only renamed and deleted here.
--   stored answer a large response, likewise: the consumer SETs it at body_key(q, name)
--                (name = "a<stream id>.<consumer's token>.<n>", never reused) in the same
--                write as its complete.lua call, whose outcome is then "A<length>:<name>"
--                instead of "O<response>"; that outcome is recorded and pushed as any
--                other, and the producers fetch the answer. Deleted by complete.lua when
--                its outcome loses, by the producer once read when nothing caches it
--                (dedup off), else by its ttl (the result ttl and a minute).

-- What the scripts call most, as locals: a global or a field is a table lookup by name
-- each time it is used (about 40 per request in submit.lua and complete.lua together).
-- Set by begin_call: while a library loads, Redis gives it neither `redis.call` nor
-- `string`.
local rcall, rpcall, byte

-- Outcomes to push, by producer: a flat list rid, outcome, rid, outcome, ...
local replies = {}

-- A whole number of milliseconds as a command argument. Lua would pass a number on
-- formatted with printf's %.17g (slow, and a real share of the server's time at high
-- rates); %d is cheap, and each value is formatted once per script call.
local ms_args = {}
local function ms_arg(n)
  local s = ms_args[n]
  if not s then
    s = string.format('%d', n)
    ms_args[n] = s
  end
  return s
end

-- Every function calls this first. The library's locals outlive a call, so what one call
-- collects (the replies to push, the numbers formatted) starts empty at the next.
local function begin_call()
  rcall, rpcall, byte = redis.call, redis.pcall, string.byte
  replies, ms_args = {}, {}
end

-- How long the body of a dead letter is kept (ms): dead letters are capped by count, not
-- by age, so a body renamed to a dead letter gets an age limit of its own.
local DEAD_BODY_TTL = 604800000

-- The key of the stored body of entry `id` (see "stored body" above): beside the stream,
-- whose key is <base>:stream, at <base>:body:<id> (keys.rs builds the same names).
local function body_key(q, id)
  if not q.bodyp then q.bodyp = string.sub(q.stream, 1, -7) .. 'body:' end
  return q.bodyp .. id
end

-- The key of the stored answer an outcome names, or nil when it is not one ("A<length>:
-- <name>", see "stored answer" above).
local function stored_answer_key(q, outcome)
  if byte(outcome, 1) ~= 65 then return nil end -- 'A'
  local name = string.match(outcome, '^A%d+:(.+)$')
  if not name then return nil end
  return body_key(q, name)
end

-- A request entry's head field: "<rid>;<from>;<deadline>;<at>;<index>" (docs/PROTOCOL.md,
-- "Entries"; the request id may hold ';', the other parts never do).
local function entry_head(rid, from, deadline, at, index)
  return rid .. ';' .. from .. ';' .. deadline .. ';' .. at .. ';' .. index
end

-- Fields of a stream entry (a flat array) as a table name -> value, first wins. A request
-- entry's head is split into rid, from, deadline, at and index, as the entries of the
-- layout before it had them (a head that is not five parts gives none of them).
local function fields_map(flat)
  local m = {}
  if not flat then return m end
  for i = 1, #flat, 2 do
    if m[flat[i]] == nil then m[flat[i]] = flat[i + 1] end
  end
  if m.head then
    m.rid, m.from, m.deadline, m.at, m.index =
      string.match(m.head, '^(.*);([^;]*);([^;]*);([^;]*);([^;]*)$')
  end
  return m
end

-- The stream id just after `id` ("<ms>-<seq>").
local function id_after(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end

-- The id just after the last entry `group` was given (every entry below it was
-- delivered), or '0-1' when the group has none or is missing. Read from XINFO GROUPS
-- pair by pair, without a table of each group's fields: this runs on every complete.lua
-- call that leaves nothing pending (every call when requests come one at a time).
local function after_last_delivered(stream, group)
  for _, g in ipairs(rcall('XINFO', 'GROUPS', stream)) do
    local name, last
    for i = 1, #g - 1, 2 do
      local k = g[i]
      if k == 'name' then
        name = g[i + 1]
      elseif k == 'last-delivered-id' then
        last = g[i + 1]
      end
    end
    if name == group then
      if last and string.find(last, '^%d+-%d+$') then return id_after(last) end
      return '0-1'
    end
  end
  return '0-1'
end

-- How much older (ms) than a finished entry the oldest pending entry may be for small
-- finished entries to wait for a trim rather than be deleted one by one (complete.lua).
local TRIM_WAIT_MS = 1000

-- Trims the finished entries off the head of the stream: XTRIM MINID ~ below the oldest
-- pending entry or, when none is pending, just past the group's last delivered entry
-- (not just past the newest entry this call finished: the entry that finishes last is
-- often the oldest one, and those finished behind it would stay). A group delivers in
-- id order, so every entry below either was delivered and is no longer pending. "~"
-- frees whole listpack nodes only, without looking inside them: the last node waits for
-- a later call or the janitor. Every script that ends pending entries calls it.
-- Returns whether the oldest pending entry was submitted more than TRIM_WAIT_MS before
-- entry `finished` (optional; an entry this call finished), by the ids' times: Redis'
-- clock, not the caller's, so a skewed client clock changes nothing.
local function trim_finished(q, finished)
  local oldest = rcall('XPENDING', q.stream, q.group, '-', '+', 1)[1]
  local bound, old = nil, false
  if oldest then
    bound = oldest[1]
    old = finished ~= nil and tonumber(string.match(bound, '^%d+')) <
      tonumber(string.match(finished, '^%d+')) - TRIM_WAIT_MS
  else
    bound = after_last_delivered(q.stream, q.group)
  end
  rcall('XTRIM', q.stream, 'MINID', '~', bound)
  return old
end

-- The parts of a pending index value: stream id, deadline (ms, a number), and the
-- waiters part ("p1;p2;", "" when nobody waits). nil when `v` is not one (missing, an
-- outcome, or a foreign value).
local function index_parse(v)
  if type(v) ~= 'string' or byte(v, 1) ~= 80 then return nil end -- 'P'
  local sid, deadline, waiters = string.match(v, '^P([^;]*);(%d+);(.*)$')
  if not sid then return nil end
  return sid, tonumber(deadline), waiters
end

-- A pending index value: stream entry `sid`, `deadline` (digits), waited for by
-- `producer` (or by nobody when it is nil).
local function index_pending(sid, deadline, producer)
  if producer then return 'P' .. sid .. ';' .. deadline .. ';' .. producer .. ';' end
  return 'P' .. sid .. ';' .. deadline .. ';'
end

-- The producers in the waiters part of a pending value, as a list.
local function index_waiters(waiters)
  local out = {}
  for w in string.gmatch(waiters, '([^;]*);') do
    if w ~= '' then out[#out + 1] = w end
  end
  return out
end

-- The waiters of `v` as a list if `v` is the pending value of stream entry `sid`, else
-- nil: index_parse then index_waiters in one, for the gate of every outcome (settle).
-- Found with plain searches: Lua's pattern matching with captures cost 11k instructions
-- of the server per request there (scripts/stream-floor.py --pelican).
local function index_waiters_of(v, sid)
  local head = 'P' .. sid .. ';'
  if string.sub(v, 1, #head) ~= head then return nil end
  local _, e = string.find(v, '^%d+;', #head + 1)
  if not e then return nil end
  local out, from = {}, e + 1
  while true do
    local n = string.find(v, ';', from, true)
    if not n then return out end
    if n > from then out[#out + 1] = string.sub(v, from, n - 1) end
    from = n + 1
  end
end

-- What to APPEND to a pending value with waiters part `waiters` so that `producer`
-- waits too; nil if it waits already.
local function index_add_waiter(waiters, producer)
  if string.find(';' .. waiters, ';' .. producer .. ';', 1, true) then return nil end
  return producer .. ';'
end

-- Pending value `v` without waiter `producer` (unchanged if it was not waiting), and
-- whether anyone still waits. nil if `v` is not a pending value.
local function index_remove_waiter(v, producer)
  local head, waiters = string.match(v, '^(P[^;]*;%d+;)(.*)$')
  if not head then return nil end
  local s, e = string.find(';' .. waiters, ';' .. producer .. ';', 1, true)
  if s then
    waiters = string.sub(waiters, 1, s - 1) .. string.sub(waiters, e)
    v = head .. waiters
  end
  return v, string.find(waiters, '[^;]') ~= nil
end

-- Whether a string value is an outcome (its tag byte: O A E D X C).
local outcome_tags = { [79] = true, [65] = true, [69] = true, [68] = true, [88] = true,
  [67] = true }
local function is_outcome(v)
  return outcome_tags[byte(v, 1)] == true
end

-- How long an outcome is kept: `ttl`, except an expiry, which is not a result: it is
-- not kept, so that a later identical request (or a waiter whose own deadline has not
-- passed, submitting again) starts afresh instead of reading "expired" from the cache.
local function outcome_ttl(outcome, ttl)
  if byte(outcome, 1) == 88 then return 0 end -- 'X'
  return ttl
end

-- Puts `outcome` in place of the index value at `key` if that value is the pending
-- state of stream entry `sid`, in one command (SET ... GET). `usual` (optional) is the
-- value it has when the one producer that submitted it waits and nobody joined (the
-- common case, compared whole: no parsing). Returns
--   'won', waiters  it was: replaced; these producers wait for the outcome (nil when
--                   the value was `usual`: its submitter alone)
--   'other'         it belongs to another entry (a garbage or foreign entry carrying the
--                   rid, a requeued dead letter while the rid is in flight again, an
--                   entry whose index expired and was submitted afresh) or is an outcome
--                   already recorded: put back as it was (first outcome wins)
--   'gone'          there was no index (it expired, or a foreign client's value was
--                   there); `outcome` is stored now
-- An expiry deletes the value instead of replacing it (outcome_ttl).
local function settle(q, key, sid, outcome, usual)
  local ttl = outcome_ttl(outcome, q.ttl)
  local old
  if ttl > 0 then
    if not q.ttl_arg then q.ttl_arg = ms_arg(q.ttl) end
    old = rpcall('SET', key, outcome, 'PX', q.ttl_arg, 'GET')
  else
    old = rpcall('GETDEL', key)
  end
  if old == usual then return 'won', nil end
  if type(old) == 'table' and old.err then
    -- Not a string: a foreign client's key, not an index. It must not abort the script
    -- (a batch's other outcomes would be half recorded): overwrite it, as if it expired.
    if ttl > 0 then
      rcall('SET', key, outcome, 'PX', ms_arg(ttl))
    else
      rcall('DEL', key)
    end
    return 'gone'
  end
  if not old then return 'gone' end
  local mine = index_waiters_of(old, sid)
  if mine then return 'won', mine end
  local isid, deadline = index_parse(old)
  local px = ttl
  if isid then
    px = math.max(deadline - q.now, 1) + q.ttl
  elseif not is_outcome(old) then
    return 'gone' -- a foreign string: replaced already
  end
  if px <= 0 then px = q.ttl end
  rcall('SET', key, old, 'PX', px)
  return 'other'
end

-- Queues `outcome` of `rid` for producer `w` (sent by `flush_replies`, which every
-- script calls last).
local function queue_reply(rid, outcome, w)
  if w ~= '' then
    local flat = replies[w]
    if not flat then
      flat = {}
      replies[w] = flat
    end
    flat[#flat + 1] = rid
    flat[#flat + 1] = outcome
  end
end

-- Queues `outcome` of `rid` for each producer in `waiters`.
local function queue_replies(rid, outcome, waiters)
  for i = 1, #waiters do queue_reply(rid, outcome, waiters[i]) end
end

-- Resolves the request carried by stream entry `sid` with `outcome`; `f` holds the
-- entry's fields rid, from and index. Callers have acknowledged `sid` already (or it was
-- never delivered), so this is the entry's one outcome. Indexed requests (dedup on) go
-- through `settle`; requests without an index have one waiter, `from`, and no stored
-- outcome. Returns the number of producers told.
local function finish(q, sid, f, outcome)
  local rid = f.rid
  if rid == nil or rid == '' then return 0 end
  local waiters = { f.from or '' }
  if f.index == '1' then
    local status, w = settle(q, q.reqp .. rid, sid, outcome)
    if status == 'won' then
      waiters = w
    elseif status == 'other' then
      return 0
    end
  end
  queue_replies(rid, outcome, waiters)
  return #waiters
end

-- Pushes the outcomes collected by `finish`: one XADD per producer, not per outcome.
-- NOMKSTREAM: a producer whose reply stream expired is gone; do not recreate it.
-- pcall: a key of another type there (a foreign client's) must not abort the script
-- after its work is done, losing the other producers' replies; that one cannot be told.
local function flush_replies(q)
  for w, flat in pairs(replies) do
    for i = 1, #flat, 400 do
      rpcall('XADD', q.replyp .. w, 'NOMKSTREAM', 'MAXLEN', '~', q.maxlen, '*',
        unpack(flat, i, math.min(i + 399, #flat)))
    end
  end
  replies = {}
end

-- Moves stream entry `e.sid` (fields `e.fields`, a flat array, nil if the entry is
-- gone) to the dead-letter stream with `e.reason`, `e.deliveries` and `e.consumer`
-- (its last owner), acknowledges and deletes it, and tells its waiters.
-- A value longer than q.max_body is not copied (an oversized body must not be stored
-- twice); its length is recorded as `<field>_bytes` instead.
local function bury(q, e)
  local args = { 'XADD', q.dead, 'MAXLEN', '~', q.dead_maxlen, '*',
    'entry', e.sid, 'reason', e.reason, 'deliveries', e.deliveries, 'consumer', e.consumer,
    'dead_at', ms_arg(q.now) }
  local flat = e.fields
  if flat then
    for i = 1, #flat - 1, 2 do
      if #flat[i + 1] > q.max_body then
        args[#args + 1] = flat[i] .. '_bytes'
        args[#args + 1] = #flat[i + 1]
      else
        args[#args + 1] = flat[i]
        args[#args + 1] = flat[i + 1]
      end
    end
  end
  local did = rcall(unpack(args))
  local f = fields_map(flat)
  if f.bref == '1' then
    -- the stored body goes with its dead letter (gone already if its ttl passed)
    local dkey = body_key(q, 'd' .. did)
    local moved = rpcall('RENAME', body_key(q, e.sid), dkey)
    if type(moved) ~= 'table' or not moved.err then
      rcall('PEXPIRE', dkey, DEAD_BODY_TTL)
    end
  end
  rcall('XACK', q.stream, q.group, e.sid)
  rcall('XDEL', q.stream, e.sid)
  return finish(q, e.sid, f, 'D' .. e.reason)
end
