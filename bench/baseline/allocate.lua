-- allocate.lua: lease one slot on one candidate key, or say when it may free
-- up. Allocate runs it once per candidate so that every run stays in the
-- candidate's hash slot (see doc.go).
--
-- KEYS[1]  key HASH          <prefix>:key:{<key_id>}
-- KEYS[2]  lease ZSET        <prefix>:key:{<key_id>}:leases
-- KEYS[3]  new lease record  <prefix>:key:{<key_id>}:lease:<member>
-- ARGV[1]  key id
-- ARGV[2]  provider
-- ARGV[3]  pool
-- ARGV[4]  lease member, <lease_id>/<provider>/<pool> (redisschema.Member),
--          its lease id fresh per Allocate call
-- ARGV[5]  lease ttl in ms, at least 1
-- ARGV[6]  record grace in ms: the record expires this long after the lease
-- ARGV[7]  lease record name prefix, <prefix>:key:{<key_id>}:lease: ; the
--          records of pruned leases are named from it and so share KEYS[1]'s
--          hash tag and slot
--
-- Returns {1, lease_until, fence, pruned} on a grant, else {0, free_at, held}:
-- the earliest ms at which the key may grant (0 if it never frees up by
-- itself), and 1 if that is when a held lease ends, else 0.

local now = now_ms()
local leases, member = KEYS[2], ARGV[4]

-- go-redis resends a script after a broken connection; if the lost run had
-- granted, return that lease instead of taking a second slot.
local mine = redis.call('ZSCORE', leases, member)
if mine and tonumber(mine) > now then
	return {1, tonumber(mine), int(redis.call('HGET', KEYS[3], 'fence')) or 0, 0}
end

local k = redis.call('HMGET', KEYS[1], 'provider', 'pool', 'status', 'cooldown_until', 'max_concurrent_uses', 'fence', 'held_until')
-- Membership is the key HASH's, in this slot; the pool ZSET is elsewhere.
if k[1] ~= ARGV[2] or k[2] ~= ARGV[3] then
	return {0, 0, 0}
end
local status, ok = k[3], usable(k[3], k[4], now)
-- Held back after a loss (optimistic.Options.LostHold): no grant before.
local hold = int(k[7]) or 0
local limit = parse_limit(k[5])
local live = redis.call('ZCOUNT', leases, '(' .. now, '+inf')

if ok and hold <= now and live < limit then
	local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
	for _, id in ipairs(expired) do
		redis.call('DEL', ARGV[7] .. id)
	end
	if #expired > 0 then
		redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
	end
	local expiry = now + tonumber(ARGV[5])
	-- optimistic.NextFence; formatted as an integer, since Redis would write
	-- a Lua number this large in exponent notation.
	local fence = string.format('%.0f', math.max((int(k[6]) or 0) + 1, now_us()))
	redis.call('ZADD', leases, expiry, member)
	redis.call('HSET', KEYS[3], 'key_id', ARGV[1], 'provider', ARGV[2], 'pool', ARGV[3],
		'lease_until', expiry, 'fence', fence)
	redis.call('PEXPIREAT', KEYS[3], expiry + tonumber(ARGV[6]))
	redis.call('HSET', KEYS[1], 'status', 'available', 'cooldown_until', '',
		'last_used_at', now, 'fence', fence)
	return {1, expiry, tonumber(fence), #expired}
end

-- No grant: free_at as optimistic's freeAt computes it (optimistic.FreeAt,
-- then a hold that ends later).
local first = 0
if live >= limit then
	first = tonumber(redis.call('ZRANGEBYSCORE', leases, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2])
end
local at = math.max(now, first)
if not ok then
	local cd = int(k[4])
	if cd == nil or (status ~= 'rate_limited' and status ~= 'cooldown') then
		return {0, 0, 0}
	end
	at = math.max(cd, first)
end
if hold > at then
	return {0, hold, 0}
end
return {0, at, (first > 0 and at == first) and 1 or 0}
