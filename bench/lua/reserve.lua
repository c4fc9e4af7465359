-- The Lua reserve that QUOTA.RESERVE replaces (benchmark baseline, see bench/main.rs), as
-- issue 5 describes it: HGET total, used, reserved; deny if total - used - reserved < amount;
-- else HINCRBY reserved, HSET the detail hash {quota_key, amount, status, ts = TIME[1]},
-- EXPIRE it 3600 s.
-- KEYS[1] tenant hash {total, used, reserved}; KEYS[2] detail hash quota_reserve:<id>
-- ARGV[1] amount. Returns 1 (granted) or 0 (denied).
local amount = tonumber(ARGV[1])
local total = tonumber(redis.call('HGET', KEYS[1], 'total')) or 0
local used = tonumber(redis.call('HGET', KEYS[1], 'used')) or 0
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved')) or 0
if total - used - reserved < amount then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'reserved', amount)
local now = redis.call('TIME')
redis.call('HSET', KEYS[2], 'quota_key', KEYS[1], 'amount', amount, 'status', 'reserved', 'ts', now[1])
redis.call('EXPIRE', KEYS[2], 3600)
return 1
