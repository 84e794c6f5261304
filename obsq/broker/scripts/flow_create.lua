-- A new flow (Client.enqueue of a chain or chord): its steps, what each waits for, and its
-- first steps marked as launching, so that a producer that dies before enqueueing them
-- leaves them to the flow sweep (FlowLoop). A flow that exists already is left as it is.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 1 when written, 0 when the flow existed. Refused above the producers' share, as
-- an enqueue is, before anything is written: a flow once written runs to its end (its next
-- steps are not held to the share).
if redis.call('EXISTS', KEYS[@k_flow]) == 1 then
  return 0
end
local cost = 0
for i = @values, #ARGV do
  cost = cost + #ARGV[i]
end
local full = above_share(tonumber(ARGV[@share]), cost)
if full then
  return redis.error_reply('OBSQFULL ' .. full)
end
local count = tonumber(ARGV[@count])
local first, fields = {}, {}
for i = @values, @values - 1 + count do
  first[#first + 1] = ARGV[i]
end
for i = @values + count, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
call_sliced('HSET', KEYS[@k_flow], fields)
redis.call('HSET', KEYS[@k_flow], 'state', 'running', 'enq', now_text())
call_sliced('SADD', KEYS[@k_launching], first)
return 1
