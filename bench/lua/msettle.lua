-- The Lua multi-limit settle that QUOTA.MSETTLE replaces (benchmark baseline, see
-- bench/main.rs), for reservations made by mreserve.lua (same KEYS). Budgets as settle.lua
-- (reserved -= amount, used += actual); a window's count is corrected by (actual - amount) if
-- the call it counted is still inside the window (its member renamed "actual:id", same score),
-- else skipped. The detail hash says what each key took; it is marked settled (a duplicate
-- settle charges nothing) and kept 300 s.
-- KEYS as mreserve.lua's. ARGV[1] nb, ARGV[2] nw, ARGV[3] id, ARGV[4 ..] one actual per key.
-- Reply as QUOTA.MSETTLE's: one {status, charged, value} per key.
local nb = tonumber(ARGV[1])
local nw = tonumber(ARGV[2])
local id = ARGV[3]
local fields = {'status', 'ts'}
for i = 1, nb + nw do
  fields[i + 2] = tostring(i)
end
local d = redis.call('HMGET', KEYS[1], unpack(fields))
if not d[1] then
  return redis.error_reply('ERR unknown reservation id ' .. id)
end
local fresh = d[1] == 'reserved'
local ts = tonumber(d[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, nb do
  local k = KEYS[1 + i]
  local actual = tonumber(ARGV[3 + i])
  if fresh then
    local reserved = redis.call('HINCRBY', k, 'reserved', -tonumber(d[i + 2]))
    local used = redis.call('HINCRBY', k, 'used', actual)
    local total = tonumber(redis.call('HGET', k, 'total')) or 0
    out[i] = {'settled', actual, total - used - reserved}
  else
    local b = redis.call('HMGET', k, 'total', 'used', 'reserved')
    out[i] = {'duplicate', 0, (tonumber(b[1]) or 0) - (tonumber(b[2]) or 0) - (tonumber(b[3]) or 0)}
  end
end
for j = 1, nw do
  local z = KEYS[1 + nb + 2 * j - 1]
  local c = KEYS[1 + nb + 2 * j]
  local actual = tonumber(ARGV[3 + nb + j])
  local amount = tonumber(d[nb + j + 2])
  local cfg = redis.call('HMGET', c, 'limit', 'window_ms')
  local limit = tonumber(cfg[1])
  local edge = now - tonumber(cfg[2])
  local gone = 0
  local old = redis.call('ZRANGEBYSCORE', z, '-inf', edge)
  for _, m in ipairs(old) do
    gone = gone + tonumber(string.match(m, '^(%d+):'))
  end
  if #old > 0 then
    redis.call('ZREMRANGEBYSCORE', z, '-inf', edge)
  end
  local delta, status = 0, 'skipped'
  if fresh and ts > edge then
    redis.call('ZREM', z, string.format('%d:%s', amount, id))
    redis.call('ZADD', z, ts, string.format('%d:%s', actual, id))
    delta, status = actual - amount, 'corrected'
  end
  local sum = redis.call('HINCRBY', c, 'sum', delta - gone)
  out[nb + j] = {status, fresh and actual or 0, math.max(limit - sum, 0)}
end
if fresh then
  redis.call('HSET', KEYS[1], 'status', 'settled')
  redis.call('EXPIRE', KEYS[1], 300)
end
return out
