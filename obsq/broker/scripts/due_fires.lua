-- What the lock-holding scheduler reads each round, on Redis's clock: the entries whose next
-- fire is due (0: not picked up yet), when the next one after them is due, the version of
-- the entries, and the fires claimed but not confirmed (their scheduler stopped, or is
-- still at it).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[@k_next], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
                       ARGV[@limit])
local after = redis.call('ZRANGEBYSCORE', KEYS[@k_next], '(' .. now, '+inf', 'WITHSCORES',
                         'LIMIT', 0, 1)
return {[@r_now] = now, [@r_version] = tonumber(redis.call('GET', KEYS[@k_version]) or '0') or 0,
        [@r_soonest] = after[2] or '', [@r_due] = due,
        [@r_firing] = redis.call('HGETALL', KEYS[@k_firing])}
