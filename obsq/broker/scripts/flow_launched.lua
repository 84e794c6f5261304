-- Steps of a flow whose tasks are enqueued (or were already): no longer launching, and the
-- task each was enqueued from is dropped (the task holds it now); the last becomes `cur`, the
-- step Client.result waits on.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns the number of steps marked.
if redis.call('EXISTS', KEYS[@k_flow]) == 0 then
  return 0
end
local steps, fields = {}, {}
for i = @steps, #ARGV do
  steps[#steps + 1] = ARGV[i]
  fields[#fields + 1] = 'm:' .. ARGV[i]
  if redis.call('HGET', KEYS[@k_flow], 's:' .. ARGV[i]) == 'l' then
    redis.call('HSET', KEYS[@k_flow], 's:' .. ARGV[i], 'r')
  end
end
call_sliced('HDEL', KEYS[@k_flow], fields)
call_sliced('SREM', KEYS[@k_launching], steps)
if #steps > 0 then
  redis.call('HSET', KEYS[@k_flow], 'cur', steps[#steps])  -- what Client.result waits on
end
return #steps
