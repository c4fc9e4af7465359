-- redis-quota metrics for redis_exporter (https://github.com/oliver006/redis_exporter):
--
--   redis_exporter --script /path/to/quota-info.lua ...
--
-- The exporter drops module INFO fields it does not know, so it would not export `INFO quota`
-- by itself. This script returns every `quota_*` field of `INFO quota` as alternating names and
-- values (all integers); the exporter publishes each as
--   redis_script_values{key="quota_reserve_denied", ...} <value>
-- It only reads INFO: the exporter's user needs +eval and +info. See docs/operations.md.
local out = {}
local info = redis.call('INFO', 'quota')
for line in string.gmatch(info, '[^\r\n]+') do
  local name, value = string.match(line, '^(quota_[%w_]+):(%-?%d+)$')
  if name then
    out[#out + 1] = name
    out[#out + 1] = value
  end
end
return out
