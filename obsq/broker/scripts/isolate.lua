-- A suspect (taken back from a lost worker that ran other tasks beside it) starts alone in
-- its worker: the attempt's fence is kept in 'iso', so that recover.lua knows a loss of
-- this attempt is the task's own doing and counts it against max_recoveries.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 1, or 0 when the attempt no longer holds the task (its lease was taken over).
if redis.call('HGET', KEYS[@k_active], ARGV[@id]) ~= ARGV[@fence] .. ':' .. ARGV[@worker] then
  return 0
end
redis.call('HSET', task_key(ARGV[@id]), 'iso', ARGV[@fence])
return 1
