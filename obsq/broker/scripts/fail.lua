-- prelude: now_ms, task_key, release_attempt, settled_by, notify_done, release_limits,
--   release_successor
-- A failed attempt that may not be retried goes to the dead set, kept for inspection.
-- KEYS: lease, dead, active
-- ARGV: now, worker_id, id, fence, error, traceback, type, route slot or '', ordering key or ''
-- Returns 1 (also when this attempt's earlier, re-sent call was applied), or 0 when the
-- fencing token is stale.
local now = now_ms()
local id, fence = ARGV[3], ARGV[4]
if not release_attempt(KEYS[3], KEYS[1], id, fence, ARGV[2]) then
  return settled_by(id, fence) and 1 or 0
end
redis.call('HSET', task_key(id), 'state', 'dead', 'error', ARGV[5], 'tb', ARGV[6], 'done', now,
           'fin', fence)
redis.call('ZADD', KEYS[2], now, id)
release_limits(id, ARGV[7], ARGV[8])
release_successor(id, ARGV[9], now)
notify_done(id, 'dead', ARGV[5])
return 1
