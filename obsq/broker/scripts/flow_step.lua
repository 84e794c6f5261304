-- prelude: now_text, end_flow
-- A step's task ended (read from its queue's flow inbox, where the script that ended it
-- wrote it: see notify_done): record its result, and mark the steps it completes as
-- launching. Idempotent: an end recorded already changes nothing, so a forwarder that died
-- before it removed the inbox entry does no harm when the entry is read again.
-- A dead step fails its flow, unless every step waiting for it is the callback of a chord
-- that takes failures (`tol`): it then gets the error ('!' and the error) as that result.
-- KEYS: flow hash, results hash, launching set
-- ARGV: now, step, its end ('completed', 'dead' or 'cancelled'), its result or error
-- Returns {the flow's state ('' when it is gone), '1' when this call ended it (else ''),
-- then per step to launch: step, its task}
local flow = KEYS[1]
local state = redis.call('HGET', flow, 'state')
if not state then
  return {''}
end
local step, ended, value = ARGV[2], ARGV[3], ARGV[4]
local before = state
local was = redis.call('HGET', flow, 's:' .. step)
if was and was ~= 'c' and was ~= 'd' and was ~= 'x' then
  local letter = {completed = 'c', dead = 'd', cancelled = 'x'}
  redis.call('HSET', flow, 's:' .. step, letter[ended] or 'd')
  redis.call('SREM', KEYS[3], step)
  if state == 'running' then
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
    else
      redis.call('HSET', KEYS[2], step, stored)
      if children then
        for child in string.gmatch(children, '%S+') do
          if redis.call('HINCRBY', flow, 'left:' .. child, -1) == 0 then
            redis.call('HSET', flow, 's:' .. child, 'l')
            redis.call('SADD', KEYS[3], child)
          end
        end
      else
        end_flow('completed', now_text())
      end
    end
    state = redis.call('HGET', flow, 'state')
  end
end
local out = {state, (before == 'running' and state ~= 'running') and '1' or ''}
if state == 'running' then
  for _, launch in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    out[#out + 1] = launch
    out[#out + 1] = redis.call('HGET', flow, 'm:' .. launch) or ''
  end
end
return out
