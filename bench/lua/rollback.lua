-- The Lua rollback that QUOTA.ROLLBACK replaces (benchmark baseline, see bench/main.rs).
-- KEYS[1] tenant hash; KEYS[2] detail hash quota_reserve:<id>.
-- Returns 1 (rolled back) or -1 (not a pending reservation).
local d = redis.call('HMGET', KEYS[2], 'status', 'amount')
if d[1] ~= 'reserved' then
  return -1
end
redis.call('HINCRBY', KEYS[1], 'reserved', -tonumber(d[2]))
redis.call('HSET', KEYS[2], 'status', 'rolled_back')
redis.call('EXPIRE', KEYS[2], 300)
return 1
