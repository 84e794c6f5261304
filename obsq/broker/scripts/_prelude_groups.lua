-- Prepended after _prelude.lua: a grouped task (group.lua) waits in state 'aggregating' in
-- the list 'grp:<type> <group>', counted in `grouped` and in the zsets 'gsize:<type>',
-- 'gfirst:<type>' and 'glast:<type>'; once claimed its hash names its batch ('batch').

-- Task `id`, cancelled or deleted while it waits in its group, leaves it (one already in a
-- claimed batch stays: its aggregator has it).
local function leave_group(id)
  local f = redis.call('HMGET', task_key(id), 'state', 'type', 'grp', 'batch')
  if f[1] ~= 'aggregating' or not f[3] or f[4] then
    return
  end
  local task_type, group = f[2], f[3]
  if redis.call('LREM', prefix .. @key_group .. task_type .. ' ' .. group, 1, id) > 0 then
    redis.call('DECR', prefix .. @key_grouped)
    if redis.call('ZINCRBY', prefix .. @key_group_sizes .. task_type, -1, group) + 0 <= 0 then
      redis.call('ZREM', prefix .. @key_group_sizes .. task_type, group)
      redis.call('ZREM', prefix .. @key_group_firsts .. task_type, group)
      redis.call('ZREM', prefix .. @key_group_lasts .. task_type, group)
    end
  end
end
