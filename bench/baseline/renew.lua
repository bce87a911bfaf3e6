-- renew.lua: move a live, matching lease's expiry to now + ttl. A lost lease
-- is never recreated (ZADD XX).
--
-- KEYS[1]  lease ZSET    <prefix>:key:{<key_id>}:leases
-- KEYS[2]  lease record  <prefix>:key:{<key_id>}:lease:<member>
-- ARGV[1]  lease member, <lease_id>/<provider>/<pool> (redisschema.Member)
-- ARGV[2]  lease id
-- ARGV[3]  lease ttl in ms, at least 1
-- ARGV[4]  record grace in ms: the record expires this long after the lease
--
-- Returns the new lease_until in ms, or why not ('unknown', 'mismatch',
-- 'expired'; see holder in lib.lua), in which case it wrote nothing.

local now = now_ms()
local why = holder(KEYS[1], ARGV[1], ARGV[2], now)
if why then
	return why
end
local expiry = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[1])
redis.call('HSET', KEYS[2], 'lease_until', expiry)
redis.call('PEXPIREAT', KEYS[2], expiry + tonumber(ARGV[4]))
return expiry
