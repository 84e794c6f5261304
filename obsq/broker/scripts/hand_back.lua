-- prelude: now_ms, release_attempt, make_pending, wake, release_limits
-- Hand a worker's unfinished attempts back to the head of pending (graceful shutdown).
-- KEYS: lease, pending, wake, active
-- ARGV: now, worker_id, then per task: id, fence, type, route slot or ''
-- Returns per task 1, or 0 when the fencing token is stale.
local now = now_ms()
local out = {}
local pushed = 0
for i = 3, #ARGV, 4 do
  local id = ARGV[i]
  if release_attempt(KEYS[4], KEYS[1], id, ARGV[i + 1], ARGV[2]) then
    release_limits(id, ARGV[i + 2], ARGV[i + 3])
    make_pending(KEYS[2], id, now, true)
    pushed = pushed + 1
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
wake(KEYS[3], pushed)
return out
