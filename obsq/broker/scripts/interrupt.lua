-- prelude: (none)
-- End a worker's own wait for work (a token on its wake list), also on a Redis at
-- maxmemory: the expiry is set first, a write that cannot grow memory.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, ttl_ms
redis.call('PEXPIRE', KEYS[1], ARGV[@ttl])
redis.call('RPUSH', KEYS[1], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[@ttl])
return 1
