-- prelude: now_ms, task_key, level_lists
-- Depth of every state, age of the oldest pending task and the pause flag of one queue.
-- Pending counts the tasks a route limit holds back or that wait for their ordering key;
-- aggregating, the grouped tasks no batch has taken yet (group.lua).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now
-- Returns {pending, active, scheduled, retry, dead, completed, cancelled, oldest_due_ms or
-- -1, paused, now, aggregating}.
local now = now_ms()
local oldest, pending = -1, 0
local lists = level_lists(KEYS[1])
lists[#lists + 1] = KEYS[1]
for _, list in ipairs(lists) do  -- pending, and the lists of its other priorities
  local head = redis.call('LINDEX', list, -1)
  local due = head and tonumber(redis.call('HGET', task_key(head), 'due'))
  if due and (oldest < 0 or due < oldest) then
    oldest = due
  end
  pending = pending + redis.call('LLEN', list)
end
local waiting = tonumber(redis.call('GET', prefix .. @key_waiting)) or 0
return {[@r_pending] = pending + waiting, [@r_active] = redis.call('ZCARD', KEYS[2]),
        [@r_scheduled] = redis.call('ZCARD', KEYS[3]), [@r_retry] = redis.call('ZCARD', KEYS[4]),
        [@r_dead] = redis.call('ZCARD', KEYS[5]), [@r_completed] = redis.call('ZCARD', KEYS[6]),
        [@r_cancelled] = redis.call('ZCARD', KEYS[7]), [@r_oldest_due] = oldest,
        [@r_paused] = redis.call('EXISTS', KEYS[8]), [@r_now] = now,
        [@r_aggregating] = tonumber(redis.call('GET', prefix .. @key_grouped)) or 0}
