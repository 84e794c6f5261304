-- prelude: (none)
-- Where a flow stands, for Client.result: its state and, once it ended, how.
-- KEYS: flow hash, results hash
-- ARGV: now
-- Returns {state ('' when the flow is gone), failed step, error, the last step's result}
local f = redis.call('HMGET', KEYS[1], 'state', 'failed', 'error', 'tail')
if not f[1] then
  return {''}
end
return {f[1], f[2] or '', f[3] or '', redis.call('HGET', KEYS[2], f[4] or '')}
