-- prelude: (none)
-- Where a flow stands, for Client.result and the listings (what a flow's steps are is read
-- only for one flow: a chord of 10,000 has as many): its state and, once it ended, how.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now
-- Returns {state ('' when the flow is gone), failed step, error, steps, steps completed,
-- written (ms), ended (ms), the step launched last ('' for none) and its queue, the last
-- step's result}
local f = redis.call('HMGET', KEYS[1], 'state', 'failed', 'error', 'nodes', 'ndone', 'enq',
                     'done', 'tail', 'cur')
if not f[1] then
  return {[@r_state] = ''}
end
local queue = f[9] and redis.call('HGET', KEYS[1], 'q:' .. f[9]) or ''
return {[@r_state] = f[1], [@r_failed] = f[2] or '', [@r_error] = f[3] or '',
        [@r_steps] = f[4] or '0', [@r_completed] = f[5] or '0', [@r_written] = f[6] or '',
        [@r_ended] = f[7] or '', [@r_current] = f[9] or '',
        [@r_current_queue] = string.match(queue, '^[^\t]*'),
        [@r_result] = redis.call('HGET', KEYS[2], f[8] or '')}
