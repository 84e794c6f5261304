-- prelude: now_ms
-- Register or renew a worker's subscriptions (its heartbeat does, every interval): each
-- subscriber's entry lapses `ttl_ms` after its last renewal, on Redis's clock, so that a
-- subscriber no live worker serves stops getting copies.
-- Keys after the events' prefix: 'sub:<event>' (zset "<subscriber> <queue>" -> lapse time)
-- and `subscribed` (set of the events with subscribers).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, ttl_ms, then per subscription its event and "<subscriber> <queue>"
local lapse = now_ms() + tonumber(ARGV[@ttl])
for i = @items, #ARGV, @stride do
  redis.call('ZADD', prefix .. @key_subscribers .. ARGV[i + @event], 'GT', lapse, ARGV[i + @entry])
  redis.call('SADD', KEYS[1], ARGV[i + @event])
end
return 1
