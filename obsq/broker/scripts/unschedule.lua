-- prelude: (none)
-- Remove a schedule entry with its state, bump the version and wake the scheduler. A fire
-- it had claimed stays in `firing` until a scheduler finishes it. An entry of the App's
-- code is removed only by a scheduler (`from_app`).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, name, from_app (1/0)
-- Returns 'removed', 'none' or 'app' (refused).
local old = redis.call('HGET', KEYS[1], ARGV[@name])
if not old then
  return 'none'
end
if ARGV[@from_app] ~= '1' then
  local ok, stored = pcall(cjson.decode, old)
  if ok and type(stored) == 'table' and stored.source == 'app' then
    return 'app'
  end
end
redis.call('HDEL', KEYS[1], ARGV[@name])
redis.call('ZREM', KEYS[2], ARGV[@name])
redis.call('HDEL', KEYS[3], ARGV[@name])
redis.call('HDEL', KEYS[4], 'fires:' .. ARGV[@name], 'missed:' .. ARGV[@name])
redis.call('INCR', KEYS[5])
redis.call('DEL', KEYS[6])
redis.call('RPUSH', KEYS[6], '1')
return 'removed'
