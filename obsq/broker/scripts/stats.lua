-- prelude: now_ms, task_key
-- Depth of every state, age of the oldest pending task and the pause flag of one queue.
-- Pending counts the tasks a route limit holds back or that wait for their ordering key;
-- aggregating, the grouped tasks no batch has taken yet (group.lua).
-- KEYS: pending, lease, scheduled, retry, dead, completed, cancelled, paused
-- ARGV: now
-- Returns {pending, active, scheduled, retry, dead, completed, cancelled, oldest_due_ms or
-- -1, paused, now, aggregating}.
local now = now_ms()
local oldest = -1
local head = redis.call('LINDEX', KEYS[1], -1)
if head then
  oldest = tonumber(redis.call('HGET', task_key(head), 'due')) or -1
end
local waiting = tonumber(redis.call('GET', prefix .. 'waiting')) or 0
return {redis.call('LLEN', KEYS[1]) + waiting, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
        redis.call('ZCARD', KEYS[4]), redis.call('ZCARD', KEYS[5]), redis.call('ZCARD', KEYS[6]),
        redis.call('ZCARD', KEYS[7]), oldest, redis.call('EXISTS', KEYS[8]), now,
        tonumber(redis.call('GET', prefix .. 'grouped')) or 0}
