-- Workflows (chains and chords): a flow's keys share the hash tag `{flow:<id>}`, so one
-- script records a step's end and decides the next steps. A flow script's first key is the
-- flow's hash, `prefix .. @key_flow`: `prefix .. @key_results` holds the steps' results,
-- `prefix .. @key_launching` the steps whose enqueue is decided and not yet confirmed
-- (flow_launched.lua).

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
end
