-- Add or replace a schedule entry. An identical definition keeps its state; a new or changed
-- one gets next fire 0, which a scheduler replaces by its first fire. Every change bumps the
-- version and leaves one token on the list the lock-holding scheduler blocks on, so it
-- reads the entries again at once. An entry of the App's code is replaced only by a
-- scheduler (`from_app`).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 'same', 'new', 'replaced' or 'app' (refused).
local old = redis.call('HGET', KEYS[@k_entries], ARGV[@name])
if old == ARGV[@definition] then
  return 'same'
end
if old and ARGV[@from_app] ~= '1' then
  local ok, stored = pcall(cjson.decode, old)
  if ok and type(stored) == 'table' and stored.source == 'app' then
    return 'app'
  end
end
redis.call('HSET', KEYS[@k_entries], ARGV[@name], ARGV[@definition])
redis.call('ZADD', KEYS[@k_next], 0, ARGV[@name])
redis.call('INCR', KEYS[@k_version])
redis.call('DEL', KEYS[@k_changes])
redis.call('RPUSH', KEYS[@k_changes], '1')
if old then
  return 'replaced'
end
return 'new'
