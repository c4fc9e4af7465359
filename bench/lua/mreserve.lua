-- The Lua multi-limit admission that QUOTA.MRESERVE replaces (benchmark baseline, see
-- bench/main.rs), written from issue 19: every limit of one request checked, then all of them
-- taken, or none. Budgets as reserve.lua (a hash {total, used, reserved}, three HGETs each);
-- windows as window.lua (a ZSET of admitted calls scored by time, trimmed by ZREMRANGEBYSCORE),
-- with the call's cost in its member ("cost:id") and the window's stored configuration and
-- counted sum in a hash beside it ({limit, window_ms, sum}), so that a TPM window counts tokens.
-- The sum keeps a call O(log n + trimmed) instead of summing the ZSET. One detail hash per
-- reservation {status, ts, 1..n = amount per key} makes retries idempotent (same keys in the
-- same order) and lets msettle.lua find what each key took. Like reserve.lua, nothing releases
-- a budget's reservation when its detail hash expires; the ZSETs do not expire (the module's
-- configured window keys do not either): every call trims them.
-- KEYS[1] the detail hash; KEYS[2 .. nb+1] the budget hashes; then, per window, its ZSET and
-- its hash. ARGV[1] nb, ARGV[2] nw, ARGV[3] id, ARGV[4] detail TTL in s, ARGV[5 ..] one amount
-- per budget, then one per window.
-- Reply as QUOTA.MRESERVE's: {granted, id or nil, denied_index, retry_after_ms, {value per key}}
-- (available for a budget, remaining for a window).
local nb = tonumber(ARGV[1])
local nw = tonumber(ARGV[2])
local id = ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local fields = {'status'}
for i = 1, nb + nw do
  fields[i + 1] = tostring(i)
end
local prior = redis.call('HMGET', KEYS[1], unpack(fields))

local values = {}
local denied, retry = -1, 0
local amounts = {}
for i = 1, nb do
  local k = KEYS[1 + i]
  local a = tonumber(ARGV[4 + i])
  local total = tonumber(redis.call('HGET', k, 'total')) or 0
  local used = tonumber(redis.call('HGET', k, 'used')) or 0
  local reserved = tonumber(redis.call('HGET', k, 'reserved')) or 0
  amounts[i] = a
  values[i] = total - used - reserved
  if denied < 0 and values[i] < a then
    denied, retry = i - 1, -1
  end
end
local wins = {}
for j = 1, nw do
  local z = KEYS[1 + nb + 2 * j - 1]
  local c = KEYS[1 + nb + 2 * j]
  local a = tonumber(ARGV[4 + nb + j])
  local cfg = redis.call('HMGET', c, 'limit', 'window_ms', 'sum')
  local limit, window = tonumber(cfg[1]), tonumber(cfg[2])
  if not limit or not window then
    return redis.error_reply('ERR no window configured at ' .. c)
  end
  local edge = now - window
  -- What left the window since the last call (usually none or a few).
  local gone = 0
  local old = redis.call('ZRANGEBYSCORE', z, '-inf', edge)
  for _, m in ipairs(old) do
    gone = gone + tonumber(string.match(m, '^(%d+):'))
  end
  local counted = (tonumber(cfg[3]) or 0) - gone
  amounts[nb + j] = a
  values[nb + j] = math.max(limit - counted, 0)
  wins[j] = {z = z, c = c, gone = gone, trim = #old > 0, edge = edge}
  if denied < 0 and counted + a > limit then
    denied = nb + j - 1
    if a > limit then
      retry = -1
    else
      -- Exact: when enough of the oldest calls have left for this one to fit.
      local freed = 0
      local live = redis.call('ZRANGEBYSCORE', z, '(' .. edge, '+inf', 'WITHSCORES')
      for m = 1, #live, 2 do
        freed = freed + tonumber(string.match(live[m], '^(%d+):'))
        if counted - freed + a <= limit then
          retry = tonumber(live[m + 1]) + window - now
          break
        end
      end
    end
  end
end

if prior[1] then
  -- A retry: granted again, taking nothing more, iff it is the same request.
  local same = prior[1] == 'reserved'
  for i = 1, nb + nw do
    same = same and tonumber(prior[i + 1]) == amounts[i]
  end
  if not same then
    return redis.error_reply('CONFLICT id ' .. id .. ' is ' .. prior[1] .. ' or was another request')
  end
  return {1, id, -1, 0, values}
end
if denied >= 0 then
  return {0, false, denied, retry, values}
end

local detail = {'status', 'reserved', 'ts', now}
for i = 1, nb do
  redis.call('HINCRBY', KEYS[1 + i], 'reserved', amounts[i])
  values[i] = values[i] - amounts[i]
end
for j = 1, nw do
  local w = wins[j]
  local a = amounts[nb + j]
  if w.trim then
    redis.call('ZREMRANGEBYSCORE', w.z, '-inf', w.edge)
  end
  redis.call('ZADD', w.z, now, string.format('%d:%s', a, id))
  redis.call('HINCRBY', w.c, 'sum', a - w.gone)
  values[nb + j] = values[nb + j] - a
end
for i = 1, nb + nw do
  detail[#detail + 1] = tostring(i)
  detail[#detail + 1] = amounts[i]
end
redis.call('HSET', KEYS[1], unpack(detail))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
return {1, id, -1, 0, values}
