-- The Lua settle that QUOTA.SETTLE replaces (benchmark baseline, see bench/main.rs).
-- KEYS[1] tenant hash; KEYS[2] detail hash quota_reserve:<id>; ARGV[1] actual.
-- Returns 1 (settled) or -1 (not a pending reservation).
local d = redis.call('HMGET', KEYS[2], 'status', 'amount')
if d[1] ~= 'reserved' then
  return -1
end
local amount = tonumber(d[2])
local actual = tonumber(ARGV[1])
redis.call('HINCRBY', KEYS[1], 'reserved', -amount)
redis.call('HINCRBY', KEYS[1], 'used', actual)
redis.call('HSET', KEYS[2], 'status', 'settled', 'actual', actual)
redis.call('EXPIRE', KEYS[2], 300)
return 1
