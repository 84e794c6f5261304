-- The live subscribers of an event (subscribe.lua), those that lapsed removed.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns the "<subscriber> <queue>" entries.
redis.call('ZREMRANGEBYSCORE', KEYS[@k_subscribers], '-inf', now_ms())
local live = redis.call('ZRANGE', KEYS[@k_subscribers], 0, -1)
if #live == 0 then
  redis.call('SREM', KEYS[@k_subscribed], ARGV[@event])
end
return live
