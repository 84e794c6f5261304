-- A failed attempt goes back: to pending at once, or to the retry set until it is due (it
-- stays first of its ordering key, so the next of that key waits for it); one cancelled
-- meanwhile ends cancelled. Above the producers' share of maxmemory its error is cut short
-- (kept_failure). One whose retry would be due at or after its expiry ends dead, expired
-- (expire), its last failure named in its error.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 1 (also when this attempt's earlier, re-sent call was applied; 2 when Redis was
-- above the share and the error was cut short), 3 when it expired, or 0 when the fencing
-- token is stale.
local now = now_ms()
local id = ARGV[@id]
local stale, failure, traceback = failed_attempt(KEYS[@k_active], KEYS[@k_lease], id,
                                                 ARGV[@fence], ARGV[@worker], ARGV[@share],
                                                 ARGV[@error], ARGV[@traceback])
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
local delay = tonumber(ARGV[@delay])
local expiry = tonumber(redis.call('HGET', key, 'exp'))
if expiry and now + delay >= expiry then
  expire(id, 'its retry would have started after its expiry; its last attempt failed: '
         .. failure, now)
  return 3
end
redis.call('HINCRBY', key, 'retried', 1)
if delay > 0 then
  redis.call('HSET', key, 'state', 'retry', 'due', now + delay)
  redis.call('ZADD', KEYS[@k_retry], now + delay, id)
else
  make_pending(KEYS[@k_pending], id, now, false)
  wake(KEYS[@k_wake], 1)
end
return applied
