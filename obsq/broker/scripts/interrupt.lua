-- End a worker's own wait for work (a token on its wake list), also on a Redis at
-- maxmemory: the expiry is set first, a write that cannot grow memory.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
redis.call('PEXPIRE', KEYS[@k_wake], ARGV[@ttl])
redis.call('RPUSH', KEYS[@k_wake], 1)
redis.call('PEXPIRE', KEYS[@k_wake], ARGV[@ttl])
return 1
