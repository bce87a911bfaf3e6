-- drop.lua: delete every lease of a key (expired ones included) with their
-- records, and the key HASH itself when given. ClearLeases and DeleteKey.
--
-- KEYS[1]  lease ZSET  <prefix>:key:{<key_id>}:leases
-- KEYS[2]  key HASH    <prefix>:key:{<key_id>}, optional
-- ARGV[1]  lease record name prefix, <prefix>:key:{<key_id>}:lease: ; the
--          records are named from it and so share KEYS[1]'s hash tag and slot
--
-- Returns how many leases it deleted.

local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do
	redis.call('DEL', ARGV[1] .. id)
end
redis.call('DEL', KEYS[1])
if KEYS[2] then
	redis.call('DEL', KEYS[2])
end
return #ids
