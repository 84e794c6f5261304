-- Take, keep or release a short lock so that one process at a time runs a sweep; only the
-- owner can extend or release it.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 1 when `owner` holds the lock after the call (0 after a release).
local holder = redis.call('GET', KEYS[@k_lock])
if ARGV[@ttl] == '0' then
  if holder == ARGV[@owner] then
    redis.call('DEL', KEYS[@k_lock])
  end
  return 0
end
if holder == ARGV[@owner] then
  redis.call('PEXPIRE', KEYS[@k_lock], ARGV[@ttl])
  return 1
end
if holder then
  return 0
end
-- free: the expiry first (a no-op here), a write that cannot grow memory, so that a Redis at
-- maxmemory lets the SET through (it refuses only a script's first write that may grow it)
redis.call('PEXPIRE', KEYS[@k_lock], ARGV[@ttl])
redis.call('SET', KEYS[@k_lock], ARGV[@owner], 'PX', ARGV[@ttl])
return 1
