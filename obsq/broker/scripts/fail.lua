-- A failed attempt that may not be retried goes to the dead set, kept for inspection.
-- Above the producers' share of maxmemory its error is cut short (kept_failure).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 1 (also when this attempt's earlier, re-sent call was applied; 2 when Redis was
-- above the share and the error was cut short), or 0 when the fencing token is stale.
local now = now_ms()
local id = ARGV[@id]
local stale, error, traceback = failed_attempt(KEYS[@k_active], KEYS[@k_lease], id, ARGV[@fence],
                                               ARGV[@worker], ARGV[@share], ARGV[@error],
                                               ARGV[@traceback])
if stale then
  return stale
end
redis.call('HSET', task_key(id), 'state', 'dead', 'done', now)
redis.call('ZADD', KEYS[@k_dead], now, id)
release_limits(id, ARGV[@type], ARGV[@slot])
release_successor(id, ARGV[@ordering], now)
notify_done(id, 'dead', error)
return traceback and 1 or 2
