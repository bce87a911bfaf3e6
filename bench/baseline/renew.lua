-- renew.lua: move a live, matching lease's expiry to now + ttl. A lost lease
-- is never recreated (ZADD XX).
--
-- KEYS[1]  lease ZSET    <prefix>:key:{<key_id>}:leases
-- KEYS[2]  lease record  <prefix>:key:{<key_id>}:lease:<lease_id>
-- ARGV[1]  key id
-- ARGV[2]  provider
-- ARGV[3]  pool
-- ARGV[4]  lease id
-- ARGV[5]  lease ttl in ms, at least 1
-- ARGV[6]  record grace in ms: the record expires this long after the lease
--
-- Returns the new lease_until in ms, or why not ('unknown', 'mismatch',
-- 'expired'; see holder in lib.lua), in which case it wrote nothing.

local now = now_ms()
local why = holder(KEYS[2], KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], now)
if why then
	return why
end
local expiry = now + tonumber(ARGV[5])
redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[4])
redis.call('HSET', KEYS[2], 'lease_until', expiry)
redis.call('PEXPIREAT', KEYS[2], expiry + tonumber(ARGV[6]))
return expiry
