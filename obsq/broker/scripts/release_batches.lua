-- Hand back the batches a stopping worker still holds, so that another worker claims them
-- at once rather than when their claims run out. A batch is released only while its hash
-- names this very claim (its fence and its owner): a batch whose claim was taken over
-- meanwhile, that was ended, or that was postponed after a failure is left as it is.
-- The first write removes (a full Redis refuses a script whose first write may grow it).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns the number of batches released.
local now = now_ms()
local owner = ARGV[@owner]
local released = 0
for i = @items, #ARGV, @stride do
  local batch = ARGV[i + @id]
  local key = prefix .. @key_batch .. batch
  local f = redis.call('HMGET', key, 'fence', 'owner')
  if f[1] == ARGV[i + @fence] and f[2] == owner
      and redis.call('ZREM', KEYS[@k_batches], batch) == 1 then
    redis.call('ZADD', KEYS[@k_batches], now, batch)
    redis.call('HSET', key, 'owner', '')
    released = released + 1
  end
end
return released
