-- prelude: now_ms, task_key, make_pending, wake
-- Move due tasks from the scheduled or retry set to pending.
-- KEYS: source set (scheduled or retry), pending, wake
-- ARGV: now, batch
-- Returns {moved, milliseconds until the next task of the set is due, or -1 when it is empty}.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local moved = 0
for i = 1, #due, 2 do
  local id = due[i]
  redis.call('ZREM', KEYS[1], id)
  if redis.call('EXISTS', task_key(id)) == 1 then
    make_pending(KEYS[2], id, due[i + 1], false)  -- due since then: the wait counts from it
    moved = moved + 1
  end
end
wake(KEYS[3], moved)
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if next_due[2] then
  return {moved, math.max(tonumber(next_due[2]) - now, 0)}
end
return {moved, -1}
