-- Move due tasks from the scheduled or retry set to pending; for the scheduled set, also let
-- the best held task of each route out (its limit is checked again when it is taken), so
-- that no held task waits for good on a completion that never comes (its worker died), and
-- `batch` of each list an earlier version held tasks in, to be held anew by rank.
-- A task whose key holds no hash is set aside (set_aside) and named in the reply.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[@k_by_state], '-inf', now, 'WITHSCORES', 'LIMIT', 0, ARGV[@batch])
local moved, aside = 0, {}
local function said_aside(id, why)
  if why then
    aside[#aside + 1] = {[@r_aside_name] = @key_task .. id, [@r_aside_why] = why}
  end
end
local where = string.sub(KEYS[@k_by_state], #prefix + 1)
for i = 1, #due, 2 do
  local id = due[i]
  redis.call('ZREM', KEYS[@k_by_state], id)
  local kind = redis.call('TYPE', task_key(id)).ok
  if kind == 'hash' then
    -- due since then: the wait counts from it. A start the route's rate reserved ('rsv')
    -- goes to the head: its turn on the rate's clock is now, and behind a backlog it would
    -- start late, in the second of later reservations, beyond the rate.
    make_pending(KEYS[@k_pending], id, due[i + 1], redis.call('HEXISTS', task_key(id), 'rsv') == 1)
    moved = moved + 1
  else
    said_aside(id, task_aside(id, where, now, kind))
  end
end
wake(KEYS[@k_wake], moved)
if ARGV[@scheduled] == '1' then
  for _, pattern in ipairs(redis.call('SMEMBERS', prefix .. @key_holding)) do
    unhold(pattern, said_aside)
  end
  let_out_unranked(tonumber(ARGV[@batch]))
end
local out = {[@r_moved] = moved, [@r_next_due] = -1, [@r_aside] = aside}
local next_due = redis.call('ZRANGE', KEYS[@k_by_state], 0, 0, 'WITHSCORES')
if next_due[2] then
  out[@r_next_due] = math.max(tonumber(next_due[2]) - now, 0)
end
return out
