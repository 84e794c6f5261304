-- Cancel a running flow: no step is launched any more, and the caller cancels the steps
-- that are enqueued or running (each in its queue's slot: cancel.lua).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local flow = KEYS[@k_flow]
local state = redis.call('HGET', flow, 'state')
local out = {}
out[@r_state] = state or ''
if not state then
  return out
end
if state == 'running' then
  local count = tonumber(redis.call('HGET', flow, 'nodes'))
  local fields = {}
  for n = 0, count - 1 do
    fields[#fields + 1] = 's:' .. n
  end
  local states = hmget_sliced(flow, fields)
  for n = 0, count - 1 do
    if states[n + 1] == 'l' or states[n + 1] == 'r' then
      local o = #out
      out[o + @r_step] = n
      out[o + @r_where] = redis.call('HGET', flow, 'q:' .. n)
    end
  end
  end_flow('cancelled', now_text(), nil, nil)
  if #out > 1 then  -- the worker that records a cancelled step's end counts the flow ended
    redis.call('HSET', flow, 'untold', '1')
  end
end
return out
