-- The ZSET sliding window that QUOTA.WINDOW replaces (benchmark baseline, see bench/main.rs).
-- KEYS[1] the window ZSET; ARGV[1] limit; ARGV[2] window_ms; ARGV[3] a unique suffix for the
-- member ("now:random"); ARGV[4] (optional, memory benchmark only) the time in ms instead of TIME.
-- Returns 1 (admitted and counted) or 0 (denied).
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local now
if ARGV[4] then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now - window)
if redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
redis.call('ZADD', KEYS[1], now, string.format('%d', now) .. ':' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], window)
return 1
