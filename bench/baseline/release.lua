-- release.lua: delete a lease if key id, provider, pool and lease id all
-- match and it has not expired.
--
-- KEYS[1]  lease ZSET    <prefix>:key:{<key_id>}:leases
-- KEYS[2]  lease record  <prefix>:key:{<key_id>}:lease:<lease_id>
-- ARGV[1]  key id
-- ARGV[2]  provider
-- ARGV[3]  pool
-- ARGV[4]  lease id
--
-- Returns 'released', or why not ('unknown', 'mismatch', 'expired'; see
-- holder in lib.lua), in which case it wrote nothing.

local why = holder(KEYS[2], KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], now_ms())
if why then
	return why
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], ARGV[4])
return 'released'
