-- Steps' tasks of one flow ended (read from their queues' flow inboxes, where the script that
-- ended each wrote it: see notify_done): record their results, and mark the steps they
-- complete as launching; with no end given, only read the steps launching. Idempotent: an
-- end recorded already changes nothing, so a worker that died before it removed the inbox
-- entries does no harm when they are read again.
-- A dead step fails its flow, unless every step waiting for it is the callback of a chord
-- that takes failures (`tol`): it then gets the error ('!' and the error) as that result.
-- A flow whose record cannot serve (flow_trouble), or whose fields do not parse as it records
-- an end (the recording stops there), is named with why: its caller sets it aside.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local flow = KEYS[@k_flow]
local state = redis.pcall('HGET', flow, 'state')
local out = {[@r_state] = '', [@r_ended] = '', [@r_trouble] = ''}
if type(state) ~= 'string' then
  out[@r_trouble] = flow_trouble(state)
  return out
end
local before = state
if state ~= 'running' then  -- known ended, also when it ended before that was kept
  mark_ended(math.max(redis.call('PTTL', flow), 0))
end

-- HINCRBY of a field of the flow, which names the field when it is not a whole number
local function add(field, by)
  local n = redis.pcall('HINCRBY', flow, field, by)
  if type(n) == 'table' then
    error('field ' .. field .. ' of the flow: ' .. n.err, 0)
  end
  return n
end

local function record(step, ended, value)
  local was = redis.call('HGET', flow, 's:' .. step)
  if not was or was == 'c' or was == 'd' or was == 'x' then
    return
  end
  local letter = {completed = 'c', dead = 'd', cancelled = 'x'}
  redis.call('HSET', flow, 's:' .. step, letter[ended] or 'd')
  if ended == 'completed' then
    add('ndone', 1)
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
    if add('left:' .. child, -1) == 0 then
      redis.call('HSET', flow, 's:' .. child, 'l')
      redis.call('SADD', KEYS[@k_launching], child)
    end
  end
end

local recorded, failure = pcall(function()
  for i = @items, #ARGV, @stride do
    record(ARGV[i + @step], ARGV[i + @ended], ARGV[i + @value])
  end
end)
if not recorded then
  out[@r_state] = state
  out[@r_trouble] = 'recording a step\'s end failed: ' ..
      (type(failure) == 'table' and tostring(failure.err) or tostring(failure))
  return out
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
