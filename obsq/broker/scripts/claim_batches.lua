-- Claim batches of grouped tasks for the caller's aggregators: first the batches whose
-- claim ran out (their worker died, or their aggregator failed and its backoff is over),
-- then the oldest tasks of each due group, at most max_size a batch. A group is due when
-- it holds max_size tasks, when grace_ms passed since its newest task or max_delay_ms
-- since its oldest. Taking the ids out of their group and recording the batch is this one
-- step, so each task lands in exactly one batch. Tasks cancelled or deleted while they
-- waited are left out; each task taken keeps its batch's id in its 'batch' field.
-- A batch is the hash 'batch:<id>' (type, group, ids space-separated, fence, owner,
-- failures, error) and its claim's end in the zset `batches`.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local now = now_ms()
local owner, lease = ARGV[@owner], tonumber(ARGV[@lease])
local arg = cjson.decode(ARGV[@plan])
local fresh = arg.ids
local settings = {}  -- type -> its aggregator's pattern and limits, false for none
local function settings_of(task_type)
  if settings[task_type] == nil then
    settings[task_type] = false
    for _, p in ipairs(arg.patterns) do
      if covers(p[1], task_type) then
        settings[task_type] = p
        break
      end
    end
  end
  return settings[task_type]
end
local batches = {}
local soonest = nil  -- the next time a group or a batch is due
local function sooner(at)
  if at and (soonest == nil or at < soonest) then
    soonest = at
  end
end

-- The tasks still waiting of `ids`, each marked as the batch's: {id, payload, headers,
-- 1 when the payload is the producer's bytes (field 'bin') else 0}.
local function live(ids, batch)
  local found = {}
  for _, id in ipairs(ids) do
    local f = redis.call('HMGET', task_key(id), 'state', 'payload', 'headers', 'bin')
    if f[1] == 'aggregating' then
      redis.call('HSET', task_key(id), 'batch', batch)
      found[#found + 1] = {[@r_tasks_id] = id, [@r_tasks_payload] = f[4] or f[2] or '',
                           [@r_tasks_headers] = f[3] or '', [@r_tasks_binary] = f[4] and 1 or 0}
    end
  end
  return found
end

-- The tasks of a batch stay counted in `grouped` (the depth's aggregating) until it ends
-- (end_batch.lua), a failing one included; those cancelled or deleted leave the count
-- when the batch is claimed without them.
local function uncount(n)
  if n > 0 then
    redis.call('DECRBY', KEYS[@k_grouped], n)
  end
end

local function record(batch, task_type, group, tasks, failures)
  local fence = redis.call('INCR', prefix .. @key_fence)
  local ids = {}
  for i, t in ipairs(tasks) do
    ids[i] = t[@r_tasks_id]
  end
  redis.call('HSET', prefix .. @key_batch .. batch, 'type', task_type, 'group', group,
             'ids', table.concat(ids, ' '), 'fence', fence, 'owner', owner)
  redis.call('ZADD', KEYS[@k_batches], now + lease, batch)
  batches[#batches + 1] = {[@r_batches_id] = batch, [@r_batches_type] = task_type,
                           [@r_batches_group] = group, [@r_batches_fence] = fence,
                           [@r_batches_failures] = failures, [@r_batches_tasks] = tasks}
end

-- 1. Batches whose claim ran out, of the types the caller aggregates.
local limit = #fresh
for _, batch in ipairs(redis.call('ZRANGEBYSCORE', KEYS[@k_batches], '-inf', now, 'LIMIT', 0,
                                  limit)) do
  local key = prefix .. @key_batch .. batch
  local f = redis.pcall('HMGET', key, 'type', 'group', 'ids', 'failures')
  if f.err then
    -- not a hash (a hand edit): left for an operator to see (obsq groups), looked at again
    -- a lease later, so that it neither stops nor crowds out the queue's other batches
    redis.call('ZADD', KEYS[@k_batches], now + lease, batch)
  elseif not f[1] then
    redis.call('ZREM', KEYS[@k_batches], batch)  -- its hash is gone (a hand edit): nothing to do
  elseif settings_of(f[1]) then
    local ids = {}
    for id in string.gmatch(f[3] or '', '%S+') do
      ids[#ids + 1] = id
    end
    local tasks = live(ids, batch)
    uncount(#ids - #tasks)
    if #tasks == 0 then
      redis.call('DEL', key)
      redis.call('ZREM', KEYS[@k_batches], batch)
    else
      record(batch, f[1], f[2], tasks, tonumber(f[4]) or 0)
    end
    limit = limit - 1
  end
end

-- 2. The due groups of each type: ids out of the group, into a batch, in one step.
local used = #fresh - limit
if limit <= 0 then
  sooner(now)  -- more batches may have run out than one call takes
end
-- Claims the due groups of one type, its aggregator's limits in `t`.
local function claim_groups(task_type, t)
  local max_size, max_delay, grace = t[2], t[3], t[4]
  local first_key = prefix .. @key_group_firsts .. task_type
  local last_key = prefix .. @key_group_lasts .. task_type
  local size_key = prefix .. @key_group_sizes .. task_type
  local due = {}
  local function add(groups)
    for _, g in ipairs(groups) do
      due[g] = true
    end
  end
  local room = #fresh - used
  if room > 0 then
    add(redis.call('ZRANGEBYSCORE', size_key, max_size, '+inf', 'LIMIT', 0, room))
    add(redis.call('ZRANGEBYSCORE', first_key, '-inf', now - max_delay, 'LIMIT', 0, room))
    add(redis.call('ZRANGEBYSCORE', last_key, '-inf', now - grace, 'LIMIT', 0, room))
  end
  for group in pairs(due) do
    local list = prefix .. @key_group .. task_type .. ' ' .. group
    while used < #fresh do
      local size = tonumber(redis.call('ZSCORE', size_key, group)) or 0
      local first = tonumber(redis.call('ZSCORE', first_key, group)) or now
      local last = tonumber(redis.call('ZSCORE', last_key, group)) or now
      if size == 0 or not (size >= max_size or first + max_delay <= now or
                           last + grace <= now) then
        break
      end
      local ids = redis.call('LRANGE', list, 0, max_size - 1)
      redis.call('LTRIM', list, #ids, -1)
      local left = redis.call('LLEN', list)
      if left == 0 then
        redis.call('ZREM', size_key, group)
        redis.call('ZREM', first_key, group)
        redis.call('ZREM', last_key, group)
      else
        redis.call('ZADD', size_key, left, group)
        local head = redis.call('LINDEX', list, 0)
        redis.call('ZADD', first_key, tonumber(redis.call('HGET', task_key(head), 'enq')) or now,
                   group)
      end
      used = used + 1
      local batch = fresh[used]
      local tasks = live(ids, batch)
      uncount(#ids - #tasks)
      if #tasks > 0 then
        record(batch, task_type, group, tasks, 0)
      end
    end
  end
  if redis.call('ZCARD', size_key) == 0 then
    redis.call('SREM', KEYS[@k_group_types], task_type)
  else
    local full = redis.call('ZRANGEBYSCORE', size_key, max_size, '+inf', 'LIMIT', 0, 1)
    if #full > 0 then
      sooner(now)
    end
    local oldest = redis.call('ZRANGE', first_key, 0, 0, 'WITHSCORES')
    sooner(oldest[2] and tonumber(oldest[2]) + max_delay)
    local quietest = redis.call('ZRANGE', last_key, 0, 0, 'WITHSCORES')
    sooner(quietest[2] and tonumber(quietest[2]) + grace)
  end
end
for _, task_type in ipairs(redis.call('SMEMBERS', KEYS[@k_group_types])) do
  local t = settings_of(task_type)
  if t then
    claim_groups(task_type, t)
  end
end
local claim = redis.call('ZRANGEBYSCORE', KEYS[@k_batches], '(' .. now, '+inf', 'WITHSCORES',
                         'LIMIT', 0, 1)
sooner(claim[2] and tonumber(claim[2]))
local wait = -1
if soonest then
  wait = math.max(soonest - now, 0)
end
return {[@r_wait] = wait, [@r_batches] = batches}
