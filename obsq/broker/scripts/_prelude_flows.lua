-- Workflows (chains and chords): a flow's keys share the hash tag `{flow:<id>}`, so one
-- script records a step's end and decides the next steps. A flow script's first key is the
-- flow's hash, `prefix .. @key_flow`: `prefix .. @key_results` holds the steps' results,
-- `prefix .. @key_launching` the steps whose enqueue is decided and not yet confirmed
-- (flow_launched.lua), `prefix .. @key_flow_ended` exists from the flow's end until
-- ENDED_KEPT ms past its keys, so that a flow gone without it is known not to have ended:
-- its record was deleted outside obsq, and its steps not yet run never run. The flow sweep
-- looks at an ended flow every ten minutes and finds it gone long before that.
local ENDED_KEPT = 3600000

-- The flow's end, known for `keep` ms (its keys' keeping) and ENDED_KEPT more.
local function mark_ended(keep)
  redis.call('SET', prefix .. @key_flow_ended, '1', 'NX', 'PX', int_text(keep + ENDED_KEPT))
end

-- The flow ends in `state` ('completed', 'failed' or 'cancelled'; `failed`: the step, with
-- `error`): nothing more is launched, and its keys go after the flow's retention (`ret`, ms).
local function end_flow(state, now, failed, error)
  local flow = prefix .. @key_flow
  redis.call('HSET', flow, 'state', state, 'done', now)
  if failed then
    redis.call('HSET', flow, 'failed', failed, 'error', error)
  end
  redis.call('DEL', prefix .. @key_launching)
  local keep = redis.call('HGET', flow, 'ret') or '3600000'
  redis.call('PEXPIRE', flow, keep)
  redis.call('PEXPIRE', prefix .. @key_results, keep)
  mark_ended(tonumber(keep))
end

-- Why the flow's record cannot serve, from what reading its state gave (`read`: a string,
-- false when it is gone, or the error of a key holding no hash): '' when it can, and when it
-- is gone after it ended (its keeping past).
local function flow_trouble(read)
  if type(read) == 'table' then
    return 'its record is a ' .. redis.call('TYPE', prefix .. @key_flow).ok .. ', not a hash'
  elseif not read and redis.call('EXISTS', prefix .. @key_flow_ended) == 0 then
    return 'its record is gone though it had not ended (deleted outside obsq)'
  end
  return ''
end
