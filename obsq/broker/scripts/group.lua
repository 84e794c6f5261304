-- Add tasks to a group of one task type (client.enqueue(..., group=)). Each waits in state
-- 'aggregating' until claim_batches.lua takes it into a batch for its aggregator. A task
-- whose producer chose its id is also refused while its id is remembered in `ended`, and
-- is marked 'own' so that end_batch.lua remembers it.
-- A group's keys, after the queue's prefix: 'grp:<type> <group>' (list of its ids, oldest
-- first; a group name has no spaces) and, per type, the zsets 'gfirst:<type>',
-- 'glast:<type>' and 'gsize:<type>' (group -> its oldest task's time, its newest task's
-- time, its size), so that the due groups of a type are found with a range read each.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns per task: '' (added) or 'id' (the id exists, or is remembered).
local now = now_ms()
local task_type, group = ARGV[@type], ARGV[@group]
local list = prefix .. @key_group .. task_type .. ' ' .. group
local out, added = {}, 0
local ended = prefix .. @key_ended
for i = @items, #ARGV, @stride do
  local id = ARGV[i + @id]
  local key = task_key(id)
  local own = ARGV[i + @own] == '1'
  if redis.call('EXISTS', key) == 1 or
      (own and (tonumber(redis.call('ZSCORE', ended, id)) or 0) > now) then
    out[#out + 1] = 'id'
  else
    local fields = {'type', task_type, ARGV[i + @field], ARGV[i + @payload], 'state', 'aggregating',
                    'enq', now, 'due', now, 'grp', group}
    if own then
      fields[#fields + 1] = 'own'
      fields[#fields + 1] = '1'
    end
    if ARGV[i + @headers] ~= '' then
      fields[#fields + 1] = 'headers'
      fields[#fields + 1] = ARGV[i + @headers]
    end
    redis.call('HSET', key, unpack(fields))
    redis.call('RPUSH', list, id)
    added = added + 1
    out[#out + 1] = ''
  end
end
if added > 0 then
  redis.call('ZADD', prefix .. @key_group_firsts .. task_type, 'NX', now, group)
  redis.call('ZADD', prefix .. @key_group_lasts .. task_type, now, group)
  redis.call('ZINCRBY', prefix .. @key_group_sizes .. task_type, added, group)
  redis.call('SADD', KEYS[@k_group_types], task_type)
  redis.call('INCRBY', KEYS[@k_grouped], added)
end
return out
