-- Steps' tasks of one flow ended (read from their queues' flow inboxes, where the script that
-- ended each wrote it: see notify_done): record their results, and mark the steps they
-- complete as launching; with no end given, only read the steps launching. Idempotent: an
-- end recorded already changes nothing, so a worker that died before it removed the inbox
-- entries does no harm when they are read again.
-- A dead step fails its flow, unless every step waiting for it is the callback of a chord
-- that takes failures (`tol`): it then gets the error ('!' and the error) as that result.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local flow = KEYS[@k_flow]
local state = redis.call('HGET', flow, 'state')
local out = {}
if not state then
  out[@r_state] = ''
  return out
end
local before = state

local function record(step, ended, value)
  local was = redis.call('HGET', flow, 's:' .. step)
  if not was or was == 'c' or was == 'd' or was == 'x' then
    return
  end
  local letter = {completed = 'c', dead = 'd', cancelled = 'x'}
  redis.call('HSET', flow, 's:' .. step, letter[ended] or 'd')
  if ended == 'completed' then
    redis.call('HINCRBY', flow, 'ndone', 1)
  end
  redis.call('SREM', KEYS[@k_launching], step)
  if state ~= 'running' then
    return
  end
  local children = redis.call('HGET', flow, 'k:' .. step)
  local stored = ended == 'completed' and value or nil
  if not stored and ended == 'dead' and children then
    stored = '!' .. value
    for child in string.gmatch(children, '%S+') do
      if redis.call('HGET', flow, 'tol:' .. child) ~= '1' then
        stored = nil
      end
    end
  end
  if not stored then
    end_flow('failed', now_text(), step, ended == 'cancelled' and 'cancelled' or value)
    state = 'failed'
    return
  end
  redis.call('HSET', KEYS[@k_results], step, stored)
  if not children then
    end_flow('completed', now_text())
    state = 'completed'
    return
  end
  for child in string.gmatch(children, '%S+') do
    if redis.call('HINCRBY', flow, 'left:' .. child, -1) == 0 then
      redis.call('HSET', flow, 's:' .. child, 'l')
      redis.call('SADD', KEYS[@k_launching], child)
    end
  end
end

for i = @items, #ARGV, @stride do
  record(ARGV[i + @step], ARGV[i + @ended], ARGV[i + @value])
end
-- a flow its Client cancelled is told ended once, by the first record of a step's end
local told = before == 'cancelled' and #ARGV >= @items and redis.call('HDEL', flow, 'untold') == 1
out[@r_state] = state
out[@r_ended] = ((before == 'running' and state ~= 'running') or told) and '1' or ''
if state == 'running' then
  for _, launch in ipairs(redis.call('SMEMBERS', KEYS[@k_launching])) do
    local o = #out
    out[o + @r_step] = launch
    out[o + @r_task] = redis.call('HGET', flow, 'm:' .. launch) or ''
  end
end
return out
