-- Register or renew a worker's subscriptions (its heartbeat does, every interval): each
-- subscriber's entry lapses `ttl` after its last renewal, on Redis's clock, so that a
-- subscriber no live worker serves stops getting copies.
-- Keys after the events' prefix: 'sub:<event>' (zset "<subscriber> <queue>" -> lapse time)
-- and `subscribed` (set of the events with subscribers).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local lapse = now_ms() + tonumber(ARGV[@ttl])
for i = @items, #ARGV, @stride do
  redis.call('ZADD', prefix .. @key_subscribers .. ARGV[i + @event], 'GT', lapse, ARGV[i + @entry])
  redis.call('SADD', KEYS[@k_subscribed], ARGV[i + @event])
end
return 1
