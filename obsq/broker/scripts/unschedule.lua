-- Remove a schedule entry with its state, bump the version and wake the scheduler. A fire
-- it had claimed stays in `firing` until a scheduler finishes it. An entry of the App's
-- code is removed only by a scheduler (`from_app`).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 'removed', 'none' or 'app' (refused).
local old = redis.call('HGET', KEYS[@k_entries], ARGV[@name])
if not old then
  return 'none'
end
if ARGV[@from_app] ~= '1' then
  local ok, stored = pcall(cjson.decode, old)
  if ok and type(stored) == 'table' and stored.source == 'app' then
    return 'app'
  end
end
redis.call('HDEL', KEYS[@k_entries], ARGV[@name])
redis.call('ZREM', KEYS[@k_next], ARGV[@name])
redis.call('HDEL', KEYS[@k_last], ARGV[@name])
redis.call('HDEL', KEYS[@k_counts], 'fires:' .. ARGV[@name], 'missed:' .. ARGV[@name])
redis.call('INCR', KEYS[@k_version])
redis.call('DEL', KEYS[@k_changes])
redis.call('RPUSH', KEYS[@k_changes], '1')
return 'removed'
