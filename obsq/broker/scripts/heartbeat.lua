-- Refresh a worker's heartbeat key. A worker whose heartbeat Redis refused would be taken
-- for lost and its running tasks would run twice, so the first write is one that cannot
-- grow memory (PEXPIRE): a Redis at maxmemory refuses a script's first write that may grow
-- memory, and lets a script that has already written run to its end.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
redis.call('PEXPIRE', KEYS[@k_worker], ARGV[@ttl])
redis.call('SET', KEYS[@k_worker], ARGV[@description], 'PX', ARGV[@ttl])
return 1
