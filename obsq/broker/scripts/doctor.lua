-- `obsq doctor`: one bounded step of checking a queue's invariants, or one safe repair.
-- Reads only, but for the repairs ('drop', 'aside', 'unleased', 'bury', 'settle', and 'levels'
-- with `mark`), which re-check what they mend.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- The steps, and what each returns:
--   'list': ids of a list (from its head) whose task hash is gone ('missing'), whose key
--       holds no hash ('unreadable', its type), whose state is not `state`, or whose `field`
--       is not `value` ('' skips either check); returns {length, {id, problem, what was
--       found}, ...}
--   'zset': the same for a zset, by rank (a `completed` id past its retention may have
--       lost its hash: not reported)
--   'held': the same for a sorted set of held tasks, its members ('<place>:<id>') reported
--   'lease': attempts whose lease ended over `grace` ago ('expired', owner), with no owner
--       ('unowned'), no task hash ('missing') or a key holding no hash ('unreadable');
--       returns {length, {id, problem, owner}, ...}
--   'owners': attempts of the active hash without a lease; {cursor, id, owner, ...}
--   'options': the ids of a list with stored options, and those options (the worker reads
--       them: obsq/engine/execution.py); {length, id, options, ...}
--   'junk': a step of the queue's junk (set_aside); {cursor, name, "<ms> <why>", ...}
--   'ord': the tasks waiting for the given ordering keys (all but the first of each)
--   'counters': {waiting, held, grouped, in groups, in batches, {pattern of a sorted set of
--       held tasks, ...}, {pattern of an earlier version's list of them, ...}}
--   'drop': remove the given ids without a task hash from the list or zset (`kind`
--       'list'; 'held', members of a sorted set of held tasks, and 'held_list', ids of an
--       earlier version's list, both counted out of `waiting`; 'ord', an ordering key's
--       list, whose next task is let out as when a task of the key ends; 'zset'; or
--       'lease', which drops their active entries too); returns how many went
--   'aside': set the given ids whose key holds no hash aside (set_aside), out of the list
--       or zset as 'drop' takes them out; returns how many went
--   'unleased': give the given attempts of the active hash that have no lease one that
--       ended (the recoverer takes them back); returns how many
--   'bury': end the given tasks of the pending lists dead with `why`, as a worker ends a
--       task it cannot build; returns how many
--   'settle': set the counter to `wanted` if it still reads `expected`; 1 if it did
--   'levels': {the priorities whose pending list holds tasks and is not named in `levels`
--       (no worker would fetch them), the members of `levels` that are not 1 to 9 (a fetch
--       sets them aside)}; with `mark`, names the first there and sets the others aside
local step = ARGV[@step]

local function check(id, state, field, value)
  local f = redis.pcall('HMGET', task_key(id), 'state', field ~= '' and field or 'state')
  if f.err then
    return {id, 'unreadable', redis.call('TYPE', task_key(id)).ok}
  elseif not f[1] then
    return {id, 'missing', ''}
  elseif state ~= '' and f[1] ~= state then
    return {id, 'state', f[1]}
  elseif field ~= '' and f[2] ~= value then
    return {id, field, f[2] or ''}
  end
  return nil
end

if step == 'list' or step == 'zset' or step == 'held' then
  local offset, count = tonumber(ARGV[@offset]), tonumber(ARGV[@count])
  local ids, length
  if step == 'list' then
    ids = redis.call('LRANGE', KEYS[@k_key], offset, offset + count - 1)
    length = redis.call('LLEN', KEYS[@k_key])
  else
    ids = redis.call('ZRANGE', KEYS[@k_key], offset, offset + count - 1)
    length = redis.call('ZCARD', KEYS[@k_key])
  end
  local out = {length}
  local now = ARGV[@state] == 'completed' and now_ms()
  for _, id in ipairs(ids) do
    local problem = check(step == 'held' and held_id(id) or id, ARGV[@state], ARGV[@field],
                          ARGV[@value])
    if problem then
      problem[1] = id
    end
    -- a completed task's hash expires a minute after its retention, and the janitor takes
    -- its id out of `completed` when a worker runs: an id past its retention is no damage
    if problem and not (now and problem[2] == 'missing'
                        and tonumber(redis.call('ZSCORE', KEYS[@k_key], id)) <= now) then
      out[#out + 1] = problem
    end
  end
  return out
elseif step == 'lease' then
  local now = now_ms()
  local offset, count = tonumber(ARGV[@offset]), tonumber(ARGV[@count])
  local raw = redis.call('ZRANGE', KEYS[@k_lease], offset, offset + count - 1, 'WITHSCORES')
  local out = {redis.call('ZCARD', KEYS[@k_lease])}
  for i = 1, #raw, 2 do
    local id = raw[i]
    local owner = redis.call('HGET', KEYS[@k_active], id)
    local kind = redis.call('TYPE', task_key(id)).ok
    if kind == 'none' then
      out[#out + 1] = {id, 'missing', owner or ''}
    elseif kind ~= 'hash' then
      out[#out + 1] = {id, 'unreadable', kind}
    elseif not owner then
      out[#out + 1] = {id, 'unowned', ''}
    elseif tonumber(raw[i + 1]) < now - tonumber(ARGV[@grace]) then
      out[#out + 1] = {id, 'expired', owner}
    end
  end
  return out
elseif step == 'owners' then
  local scan = redis.call('HSCAN', KEYS[@k_active], ARGV[@cursor], 'COUNT', ARGV[@count])
  local out = {scan[1]}
  for i = 1, #scan[2], 2 do
    if not redis.call('ZSCORE', KEYS[@k_lease], scan[2][i]) then
      out[#out + 1] = scan[2][i]
      out[#out + 1] = scan[2][i + 1]
    end
  end
  return out
elseif step == 'options' then
  local offset, count = tonumber(ARGV[@offset]), tonumber(ARGV[@count])
  local out = {redis.call('LLEN', KEYS[@k_key])}
  for _, id in ipairs(redis.call('LRANGE', KEYS[@k_key], offset, offset + count - 1)) do
    local options = redis.pcall('HGET', task_key(id), 'opts')
    if type(options) == 'string' and options ~= '' then
      out[#out + 1] = id
      out[#out + 1] = options
    end
  end
  return out
elseif step == 'junk' then
  local scan = redis.call('HSCAN', prefix .. @key_junk, ARGV[@cursor], 'COUNT', ARGV[@count])
  local out = {scan[1]}
  for _, v in ipairs(scan[2]) do
    out[#out + 1] = v
  end
  return out
elseif step == 'ord' then
  local waiting = 0
  for i = @keys, #ARGV do
    waiting = waiting + math.max(redis.call('LLEN', prefix .. @key_ordering .. ARGV[i]) - 1, 0)
  end
  return waiting
elseif step == 'counters' then
  local patterns = redis.call('SMEMBERS', prefix .. @key_holding)
  local unranked = redis.call('SMEMBERS', prefix .. @key_holding_unranked)
  table.sort(patterns)
  table.sort(unranked)
  local held = 0
  for _, pattern in ipairs(patterns) do
    held = held + redis.call('ZCARD', prefix .. @key_held .. pattern)
  end
  for _, pattern in ipairs(unranked) do
    held = held + redis.call('LLEN', prefix .. @key_held_unranked .. pattern)
  end
  local in_groups = 0
  for _, task_type in ipairs(redis.call('SMEMBERS', KEYS[@k_group_types])) do
    for _, group in ipairs(redis.call('ZRANGE', prefix .. @key_group_sizes .. task_type, 0, -1)) do
      in_groups = in_groups + redis.call('LLEN', prefix .. @key_group .. task_type .. ' ' .. group)
    end
  end
  local in_batches = 0
  for _, batch in ipairs(redis.call('ZRANGE', KEYS[@k_batches], 0, -1)) do
    local ids = redis.pcall('HGET', prefix .. @key_batch .. batch, 'ids')
    if type(ids) == 'string' then
      for _ in string.gmatch(ids, '%S+') do
        in_batches = in_batches + 1
      end
    end
  end
  return {tonumber(redis.call('GET', prefix .. @key_waiting)) or 0, held,
          tonumber(redis.call('GET', prefix .. @key_grouped)) or 0, in_groups, in_batches,
          patterns, unranked}
elseif step == 'drop' or step == 'aside' then
  local now, kind, went = now_ms(), ARGV[@kind], 0
  local where = string.sub(KEYS[@k_key], #prefix + 1)
  for i = @ids, #ARGV do
    local id = ARGV[i]
    local task_id = kind == 'held' and held_id(id) or id
    local found = redis.call('TYPE', task_key(task_id)).ok
    if (step == 'drop' and found == 'none') or
        (step == 'aside' and found ~= 'none' and found ~= 'hash') then
      if kind == 'ord' then
        local before = redis.call('LLEN', KEYS[@k_key])
        release_successor(id, string.sub(KEYS[@k_key], #prefix + #@key_ordering + 1), now)
        went = went + before - redis.call('LLEN', KEYS[@k_key])
      elseif kind == 'held' or kind == 'held_list' then
        local n = kind == 'held' and redis.call('ZREM', KEYS[@k_key], id) or
            redis.call('LREM', KEYS[@k_key], 0, id)
        if n > 0 then
          redis.call('DECRBY', prefix .. @key_waiting, n)
        end
        went = went + n
      elseif kind == 'list' then
        went = went + redis.call('LREM', KEYS[@k_key], 0, id)
      else
        went = went + redis.call('ZREM', KEYS[@k_key], id)
        if kind == 'lease' then
          redis.call('HDEL', prefix .. @key_active, id)
        end
      end
      if step == 'aside' then
        task_aside(task_id, where, now, found)
      end
    end
  end
  return went
elseif step == 'unleased' then
  local given = 0
  for i = @attempts, #ARGV do
    if redis.call('HEXISTS', KEYS[@k_active], ARGV[i]) == 1 and
        not redis.call('ZSCORE', KEYS[@k_lease], ARGV[i]) then
      redis.call('ZADD', KEYS[@k_lease], 0, ARGV[i])
      given = given + 1
    end
  end
  return given
elseif step == 'bury' then
  local now, buried = now_ms(), 0
  for i = @ids, #ARGV do
    local id = ARGV[i]
    local f = redis.call('HMGET', task_key(id), 'state', 'pri', 'ordk')
    if f[1] == 'pending' and
        redis.call('LREM', level_list(KEYS[@k_pending], f[2]), -1, id) > 0 then
      redis.call('HSET', task_key(id), 'state', 'dead', 'error', ARGV[@why], 'done', now)
      redis.call('ZADD', prefix .. @key_dead, now, id)
      release_successor(id, f[3] or '', now)
      notify_done(id, 'dead', ARGV[@why])
      buried = buried + 1
    end
  end
  return buried
elseif step == 'levels' then
  local now, unmarked, strays = now_ms(), {}, {}
  for p = 1, 9 do
    local level = int_text(p)
    if redis.call('LLEN', prefix .. @key_pending .. ':' .. level) > 0 and
        redis.call('SISMEMBER', prefix .. @key_levels, level) == 0 then
      unmarked[#unmarked + 1] = level
      if ARGV[@mark] == '1' then
        redis.call('SADD', prefix .. @key_levels, level)
      end
    end
  end
  for _, level in ipairs(redis.call('SMEMBERS', prefix .. @key_levels)) do
    if not string.match(level, '^[1-9]$') then
      strays[#strays + 1] = level
      if ARGV[@mark] == '1' then  -- as a fetch does
        level_aside(level, now)
      end
    end
  end
  return {unmarked, strays}
elseif step == 'settle' then
  if (redis.call('GET', KEYS[@k_counter]) or '0') ~= ARGV[@expected] then
    return 0
  end
  redis.call('SET', KEYS[@k_counter], ARGV[@wanted])
  return 1
end
return redis.error_reply('unknown step ' .. tostring(step))
