-- reclaim.lua: take over entries whose consumer stopped renewing (idle >= min idle);
-- entries already delivered max_deliveries times are dead-lettered instead.
-- KEYS[1] stream   KEYS[2] dead-letter stream   KEYS[3] request prefix   KEYS[4] reply prefix
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] min idle (ms)   ARGV[4] cursor (start id, "-" first)
-- ARGV[5] count   ARGV[6] max deliveries   ARGV[7] now (ms)   ARGV[8] result ttl (ms)
-- ARGV[9] reply maxlen   ARGV[10] dead-letter maxlen   ARGV[11] max body bytes
-- ARGV[12] "1" if the consumer holds nothing (it may take an entry for its last delivery)
-- Reply: { next cursor ("-" when the scan wrapped), claimed entries as XCLAIM returns them,
--          flat list of id, delivery count for the claimed entries, number dead-lettered,
--          id of the entry claimed for its last delivery ("" if none),
--          number of entries left waiting for their last delivery }
-- An entry's last delivery (deliveries = max deliveries - 1 so far) is made alone: it is
-- claimed only by a consumer that holds nothing, as the one entry of the call, and the
-- consumer takes nothing else until it is answered. A crashing request takes the other
-- requests of its process down with it, and each of those crashes counts as one of their
-- deliveries; without this, innocent requests that kept sharing a process with a poison
-- one would be dead-lettered with it. A consumer told that entries wait stops reading,
-- lets its work in hand finish, and scans again with nothing in hand.
-- XPENDING (with IDLE) comes first so the previous owner and the delivery count are known;
-- XCLAIM with the same min idle then skips anything renewed in between (it cannot be, the
-- script is atomic, but the guard costs nothing).
local q = { stream = KEYS[1], dead = KEYS[2], reqp = KEYS[3], replyp = KEYS[4],
  group = ARGV[1], now = tonumber(ARGV[7]), ttl = tonumber(ARGV[8]), maxlen = ARGV[9],
  dead_maxlen = ARGV[10], max_body = tonumber(ARGV[11]) }
local stream, group = q.stream, q.group
local consumer, min_idle, cursor = ARGV[2], ARGV[3], ARGV[4]
local count, maxd = tonumber(ARGV[5]), tonumber(ARGV[6])
local idle = ARGV[12] == '1'
local pend = redis.call('XPENDING', stream, group, 'IDLE', min_idle, cursor, '+', count)
if #pend == 0 then return { '-', {}, {}, 0, '', 0 } end
local claim, counts, ndead, solo, waiting = {}, {}, 0, '', 0
for _, e in ipairs(pend) do
  local id, owner, deliveries = e[1], e[2], tonumber(e[4])
  if deliveries >= maxd then
    local r = redis.call('XRANGE', stream, id, id)
    local flat = nil
    if r[1] then flat = r[1][2] end
    local times = deliveries .. ' times'
    if deliveries == 1 then times = 'once' end
    bury(q, { sid = id, fields = flat, deliveries = deliveries, consumer = owner,
      reason = 'delivered ' .. times .. ' without an outcome (max_deliveries '
        .. maxd .. '); last consumer ' .. owner })
    ndead = ndead + 1
  elseif deliveries == maxd - 1 and (not idle or solo ~= '' or #claim > 0) then
    -- its last delivery waits for a consumer with nothing in hand
    waiting = waiting + 1
  elseif solo ~= '' then
    -- left for the next call: nothing joins a last delivery
  else
    if deliveries == maxd - 1 then solo = id end
    claim[#claim + 1] = id
    counts[#counts + 1] = id
    counts[#counts + 1] = deliveries + 1
  end
end
local claimed = {}
if #claim > 0 then
  claimed = redis.call('XCLAIM', stream, group, consumer, min_idle, unpack(claim))
end
if ndead > 0 then trim_finished(q) end
flush_replies(q)
local next_cursor = '-'
if solo ~= '' then
  next_cursor = '(' .. solo
elseif #pend >= count then
  next_cursor = '(' .. pend[#pend][1]
end
return { next_cursor, claimed, counts, ndead, solo, waiting }
