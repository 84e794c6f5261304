-- prelude: now_ms
-- What the lock-holding scheduler reads each round, on Redis's clock: the entries whose next
-- fire is due (0: not picked up yet), when the next one after them is due, the version of
-- the entries, and the fires claimed but not confirmed (their scheduler stopped, or is
-- still at it).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, limit
-- Returns {now, version, soonest next fire after now ('' when none), {name, next, ...},
--          {name, claim, ...}}
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, ARGV[@limit])
local after = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0,
                         1)
return {[@r_now] = now, [@r_version] = tonumber(redis.call('GET', KEYS[2]) or '0') or 0,
        [@r_soonest] = after[2] or '', [@r_due] = due,
        [@r_firing] = redis.call('HGETALL', KEYS[3])}
