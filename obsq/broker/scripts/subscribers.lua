-- prelude: now_ms
-- The live subscribers of an event (subscribe.lua), those that lapsed removed.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, event
-- Returns the "<subscriber> <queue>" entries.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
if #live == 0 then
  redis.call('SREM', KEYS[2], ARGV[@event])
end
return live
