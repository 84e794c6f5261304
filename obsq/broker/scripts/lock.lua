-- prelude: (none)
-- Take, keep or release a short lock so that one process at a time runs a sweep; only the
-- owner can extend or release it.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, owner, ttl_ms (0: release)
-- Returns 1 when `owner` holds the lock after the call (0 after a release).
local holder = redis.call('GET', KEYS[1])
if ARGV[@ttl] == '0' then
  if holder == ARGV[@owner] then
    redis.call('DEL', KEYS[1])
  end
  return 0
end
if holder == ARGV[@owner] then
  redis.call('PEXPIRE', KEYS[1], ARGV[@ttl])
  return 1
end
if holder then
  return 0
end
-- free: the expiry first (a no-op here), a write that cannot grow memory, so that a Redis at
-- maxmemory lets the SET through (it refuses only a script's first write that may grow it)
redis.call('PEXPIRE', KEYS[1], ARGV[@ttl])
redis.call('SET', KEYS[1], ARGV[@owner], 'PX', ARGV[@ttl])
return 1
