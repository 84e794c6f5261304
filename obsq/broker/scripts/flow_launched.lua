-- prelude: call_sliced
-- Steps of a flow whose tasks are enqueued (or were already): no longer launching, and the
-- task each was enqueued from is dropped (the task holds it now); the last becomes `cur`, the
-- step Client.result waits on.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, the steps
-- Returns the number of steps marked.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local steps, fields = {}, {}
for i = @steps, #ARGV do
  steps[#steps + 1] = ARGV[i]
  fields[#fields + 1] = 'm:' .. ARGV[i]
  if redis.call('HGET', KEYS[1], 's:' .. ARGV[i]) == 'l' then
    redis.call('HSET', KEYS[1], 's:' .. ARGV[i], 'r')
  end
end
call_sliced('HDEL', KEYS[1], fields)
call_sliced('SREM', KEYS[2], steps)
if #steps > 0 then
  redis.call('HSET', KEYS[1], 'cur', steps[#steps])  -- what Client.result waits on
end
return #steps
