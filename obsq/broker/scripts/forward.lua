-- prelude: now_ms, task_key, make_pending, wake, unhold
-- Move due tasks from the scheduled or retry set to pending; with ARGV[3] = 1, also let the
-- longest-held task of each route out (its limit is checked again when it is taken), so
-- that no held task waits for good on a completion that never comes (its worker died).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, batch, 1 or 0
-- Returns {moved, milliseconds until the next task of the set is due, or -1 when it is empty}.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, ARGV[@batch])
local moved = 0
for i = 1, #due, 2 do
  local id = due[i]
  redis.call('ZREM', KEYS[1], id)
  if redis.call('EXISTS', task_key(id)) == 1 then
    -- due since then: the wait counts from it. A start the route's rate reserved ('rsv')
    -- goes to the head: its turn on the rate's clock is now, and behind a backlog it would
    -- start late, in the second of later reservations, beyond the rate.
    make_pending(KEYS[2], id, due[i + 1], redis.call('HEXISTS', task_key(id), 'rsv') == 1)
    moved = moved + 1
  end
end
wake(KEYS[3], moved)
if ARGV[@scheduled] == '1' then
  for _, pattern in ipairs(redis.call('SMEMBERS', prefix .. @key_holding)) do
    unhold(pattern)
  end
end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if next_due[2] then
  return {[@r_moved] = moved, [@r_next_due] = math.max(tonumber(next_due[2]) - now, 0)}
end
return {[@r_moved] = moved, [@r_next_due] = -1}
