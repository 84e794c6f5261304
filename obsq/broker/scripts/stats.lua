-- Depth of every state, age of the oldest pending task and the pause flag of one queue.
-- Pending counts the tasks a route limit holds back or that wait for their ordering key,
-- and those waiting under a fairness key (the age of each key's next in line is read), and
-- the `top` fairness keys with most waiting tasks are named;
-- aggregating, the grouped tasks no batch has taken yet (group.lua).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local now = now_ms()
local oldest, pending = -1, 0
local lists = level_lists(KEYS[@k_pending])
lists[#lists + 1] = KEYS[@k_pending]
for _, list in ipairs(lists) do  -- pending, and the lists of its other priorities
  local head = redis.call('LINDEX', list, -1)
  local due = head and tonumber(redis.call('HGET', task_key(head), 'due'))
  if due and (oldest < 0 or due < oldest) then
    oldest = due
  end
  pending = pending + redis.call('LLEN', list)
end
-- the keyed tasks: each key's task next in line, the oldest of them
local keyed = redis.call('ZRANGE', prefix .. @key_fair_age, 0, 0, 'WITHSCORES')[2]
if keyed and (oldest < 0 or tonumber(keyed) < oldest) then
  oldest = tonumber(keyed)
end
local waiting = (tonumber(redis.call('GET', prefix .. @key_waiting)) or 0) +
                (tonumber(redis.call('GET', prefix .. @key_fair_count)) or 0)
local top = {}
local found = redis.call('ZREVRANGE', prefix .. @key_fair_waiting, 0, tonumber(ARGV[@top]) - 1,
                         'WITHSCORES')
for i = 1, #found, 2 do
  top[#top + 1] = {[@r_fair_top_key] = found[i], [@r_fair_top_waiting] = found[i + 1]}
end
return {[@r_pending] = pending + waiting, [@r_active] = redis.call('ZCARD', KEYS[@k_lease]),
        [@r_scheduled] = redis.call('ZCARD', KEYS[@k_scheduled]),
        [@r_retry] = redis.call('ZCARD', KEYS[@k_retry]), [@r_dead] = redis.call('ZCARD', KEYS[@k_dead]),
        [@r_completed] = redis.call('ZCARD', KEYS[@k_completed]),
        [@r_cancelled] = redis.call('ZCARD', KEYS[@k_cancelled]), [@r_oldest_due] = oldest,
        [@r_paused] = redis.call('EXISTS', KEYS[@k_paused]), [@r_now] = now,
        [@r_aggregating] = tonumber(redis.call('GET', prefix .. @key_grouped)) or 0,
        [@r_fair_keys] = redis.call('ZCARD', prefix .. @key_fair_waiting), [@r_fair_top] = top}
