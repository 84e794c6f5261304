-- prelude: now_ms, task_key, failed_attempt, make_pending, wake, release_limits,
--   cancel_requested, end_cancelled
-- A failed attempt goes back: to pending at once, or to the retry set until it is due (it
-- stays first of its ordering key, so the next of that key waits for it); one cancelled
-- meanwhile ends cancelled.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, worker_id, id, fence, delay_ms, error, traceback, type, route slot or '', the
--       producers' share of maxmemory (above it the error is cut short: kept_failure)
-- Returns 1 (also when this attempt's earlier, re-sent call was applied; 2 when Redis was
-- above the share and the error was cut short), or 0 when the fencing token is stale.
local now = now_ms()
local id = ARGV[@id]
local stale, _, traceback = failed_attempt(KEYS[5], KEYS[1], id, ARGV[@fence], ARGV[@worker],
                                           ARGV[@share], ARGV[@error], ARGV[@traceback])
if stale then
  return stale
end
local key = task_key(id)
release_limits(id, ARGV[@type], ARGV[@slot])
redis.call('HDEL', key, 'sus', 'iso')  -- it ran to its end: it did not kill its worker
local applied = traceback and 1 or 2
if cancel_requested(id) then
  end_cancelled(id, now)
  return applied
end
redis.call('HINCRBY', key, 'retried', 1)
local delay = tonumber(ARGV[@delay])
if delay > 0 then
  redis.call('HSET', key, 'state', 'retry', 'due', now + delay)
  redis.call('ZADD', KEYS[2], now + delay, id)
else
  make_pending(KEYS[3], id, now, false)
  wake(KEYS[4], 1)
end
return applied
