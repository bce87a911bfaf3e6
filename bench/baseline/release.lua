-- release.lua: delete a lease if key id, provider, pool and lease id all
-- match and it has not expired.
--
-- KEYS[1]  lease ZSET    <prefix>:key:{<key_id>}:leases
-- KEYS[2]  lease record  <prefix>:key:{<key_id>}:lease:<member>
-- ARGV[1]  lease member, <lease_id>/<provider>/<pool> (redisschema.Member)
-- ARGV[2]  lease id
--
-- Returns 'released', or why not ('unknown', 'mismatch', 'expired'; see
-- holder in lib.lua), in which case it wrote nothing.

local why = holder(KEYS[1], ARGV[1], ARGV[2], now_ms())
if why then
	return why
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], ARGV[1])
return 'released'
