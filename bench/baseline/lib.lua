-- lib.lua: helpers put in front of every script of this package (EVAL has
-- no modules). It reads no KEYS or ARGV of its own.

-- now_ms is the server's clock in ms: the one clock all allocators share.
local function now_ms()
	local t = redis.call('TIME')
	return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- now_us is that clock in microseconds (exact in a double until 2255).
local function now_us()
	local t = redis.call('TIME')
	return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- int parses a stored integer as Go's strconv.ParseInt does: optional sign,
-- decimal digits, within int64 (Lua numbers are doubles, so the bounds
-- themselves are approximate). Anything else, false (missing) included, is
-- nil, so "2.5", " 3" and "1e3" are malformed here as in the optimistic store.
local function int(s)
	if type(s) ~= 'string' or not string.find(s, '^[+-]?%d+$') then
		return nil
	end
	local n = tonumber(s)
	if n >= 2 ^ 63 or n < -2 ^ 63 then
		return nil
	end
	return n
end

-- parse_limit is optimistic.ParseLimit: missing, malformed or < 1 means 1.
local function parse_limit(s)
	local n = int(s)
	if n == nil or n < 1 then
		return 1
	end
	return n
end

-- usable is optimistic.Usable: available, or rate_limited/cooldown whose
-- cooldown_until has passed; an empty or malformed one never passes.
local function usable(status, cooldown_until, now)
	if status == 'available' then
		return true
	end
	if status == 'rate_limited' or status == 'cooldown' then
		local cd = int(cooldown_until)
		return cd ~= nil and cd <= now
	end
	return false
end

-- holder returns nil if the lease ZSET holds member (lease_id under the
-- caller's provider and pool, redisschema.Member) unexpired, else why not:
-- 'expired' (even if not pruned yet), 'mismatch' (lease_id is there under
-- another provider or pool) or 'unknown' (not there, which a wrong key id
-- also gives since the ZSET is the key's).
local function holder(leases, member, lease_id, now)
	local expiry = redis.call('ZSCORE', leases, member)
	if expiry then
		if tonumber(expiry) <= now then
			return 'expired'
		end
		return nil
	end
	local prefix = lease_id .. '/'
	for _, m in ipairs(redis.call('ZRANGE', leases, 0, -1)) do
		if string.sub(m, 1, #prefix) == prefix then
			return 'mismatch'
		end
	end
	return 'unknown'
end
