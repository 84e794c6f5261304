-- prelude: (none)
-- Add or replace a schedule entry. An identical definition keeps its state; a new or changed
-- one gets next fire 0, which a scheduler replaces by its first fire. Every change bumps the
-- version and leaves one token on the list the lock-holding scheduler blocks on, so it
-- reads the entries again at once. An entry of the App's code is replaced only by a
-- scheduler (`from_app`).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, name, definition (JSON), from_app (1/0)
-- Returns 'same', 'new', 'replaced' or 'app' (refused).
local old = redis.call('HGET', KEYS[1], ARGV[@name])
if old == ARGV[@definition] then
  return 'same'
end
if old and ARGV[@from_app] ~= '1' then
  local ok, stored = pcall(cjson.decode, old)
  if ok and type(stored) == 'table' and stored.source == 'app' then
    return 'app'
  end
end
redis.call('HSET', KEYS[1], ARGV[@name], ARGV[@definition])
redis.call('ZADD', KEYS[2], 0, ARGV[@name])
redis.call('INCR', KEYS[3])
redis.call('DEL', KEYS[4])
redis.call('RPUSH', KEYS[4], '1')
if old then
  return 'replaced'
end
return 'new'
