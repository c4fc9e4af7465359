-- The daily counter that QUOTA.CHARGE on a PERIOD DAY budget replaces (benchmark baseline).
-- KEYS[1] the counter; ARGV[1] limit. Returns 1 iff the count after this call is <= limit.
local n = redis.call('INCR', KEYS[1])
if n == 1 then
  local t = redis.call('TIME')
  local end_of_day = (math.floor(tonumber(t[1]) / 86400) + 1) * 86400000
  redis.call('PEXPIREAT', KEYS[1], end_of_day)
end
if n <= tonumber(ARGV[1]) then
  return 1
end
return 0
