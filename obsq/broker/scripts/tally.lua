-- Count attempt outcomes of one queue in per-minute buckets (a hash per minute, kept a
-- little over an hour), on the server's clock so every worker fills the same bucket. The
-- Inspector sums them into throughput and failure counts (see throughput.lua).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local key = KEYS[@k_stats] .. ':' .. math.floor(now_ms() / 60000)
for i = @items, #ARGV, @stride do
  redis.call('HINCRBY', key, ARGV[i + @outcome], ARGV[i + @count])
end
redis.call('PEXPIRE', key, ARGV[@ttl])
return 1
