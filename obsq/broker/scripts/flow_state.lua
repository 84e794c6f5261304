-- Where a flow stands, for Client.result and the listings (what a flow's steps are is read
-- only for one flow: a chord of 10,000 has as many): its state and, once it ended, how.
-- A flow gone or unreadable has state '' and, when that is a fault, why (flow_trouble).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local f = redis.pcall('HMGET', KEYS[@k_flow], 'state', 'failed', 'error', 'nodes', 'ndone', 'enq',
                      'done', 'tail', 'cur')
if f.err or not f[1] then
  return {[@r_state] = '', [@r_failed] = '', [@r_error] = '', [@r_steps] = '0',
          [@r_completed] = '0', [@r_written] = '', [@r_ended] = '', [@r_current] = '',
          [@r_current_queue] = '', [@r_result] = '', [@r_trouble] = flow_trouble(f.err and f or f[1])}
end
local queue = f[9] and redis.call('HGET', KEYS[@k_flow], 'q:' .. f[9]) or ''
return {[@r_state] = f[1], [@r_failed] = f[2] or '', [@r_error] = f[3] or '',
        [@r_steps] = f[4] or '0', [@r_completed] = f[5] or '0', [@r_written] = f[6] or '',
        [@r_ended] = f[7] or '', [@r_current] = f[9] or '',
        [@r_current_queue] = string.match(queue, '^[^\t]*'),
        [@r_result] = redis.call('HGET', KEYS[@k_results], f[8] or ''), [@r_trouble] = ''}
