-- Enqueue a batch of tasks into one queue, each as plain values (no document to decode, no
-- escaping). A generated id is 128 random bits, free without looking: it is neither looked
-- up nor remembered. A task whose producer chose its id is refused when the id exists, or
-- its task was forgotten within the dedup window (it is in `ended`, id -> the time until
-- which it is remembered), and is marked ('own'), so the scripts that forget it remember
-- its id. A unique task is refused while its digest is held. A task whose ordering key has
-- tasks already waits behind them. The delay is added to the server's clock here, so a
-- producer's clock never decides a due time; so is a task's expiry ('exp', ms), written once:
-- a retry or a recovery never moves it. A debounced task (`debounce`) whose key's task
-- still waits replaces that task's payload and options and moves its due time instead of
-- being written (replace_waiting).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Refused above the producers' share of maxmemory (`share`, see above_share), before the
-- batch is written: the rest is for what the workers draining the queues write (their
-- calls are never refused for memory). The budget's DECRBY is the first write: past
-- maxmemory the call is refused as Redis full.
local share = tonumber(ARGV[@share])
if share < 1 then
  local cost = 0
  for i = @items, #ARGV, @stride do
    cost = cost + TASK_BYTES + #ARGV[i + @id] + #ARGV[i + @type] + #ARGV[i + @payload]
      + #ARGV[i + @headers] + #ARGV[i + @options] + #ARGV[i + @rare]
  end
  local full = above_share(share, cost)
  if full then
    return redis.error_reply('OBSQFULL ' .. full)
  end
end
local now = now_text()

local out = {}
local pending = {}  -- of priority 0: pushed at once
local woken = 0
local position = 0
for i = @items, #ARGV, @stride do
  position = position + 1
  local id = ARGV[i + @id]
  local key = task_key(id)
  -- the rarer options, decoded only for a task given any (wire.py's `rare`)
  local rare = ARGV[i + @rare] ~= '' and cjson.decode(ARGV[i + @rare])
  local own = rare and rare[@rare_own] == 1
  local field = rare and rare[@rare_binary] == 1 and 'bin' or 'payload'
  local digest = rare and rare[@rare_unique] or ''
  local ordering_key = rare and rare[@rare_ordering] or ''
  local priority = rare and rare[@rare_priority] or 0
  priority = priority > 0 and int_text(priority) or ''
  local expires = rare and rare[@rare_expires] or 0  -- ms from now
  local expires_at = expires > 0 and int_text(tonumber(now) + expires) or ''
  local fairness = rare and rare[@rare_fairness] or ''
  local debounce_key = rare and rare[@rare_debounce_key] or ''
  local refused = nil
  if own and (redis.call('EXISTS', key) == 1 or
              (tonumber(redis.call('ZSCORE', prefix .. @key_ended, id)) or 0) > tonumber(now)) then
    refused = 'id'
  elseif digest ~= '' then
    local lock = prefix .. @key_unique .. digest
    local unique_ms = int_text(math.max(rare[@rare_unique_for], 1))
    if not redis.call('SET', lock, id, 'NX', 'PX', unique_ms) then
      refused = 'unique:' .. (redis.call('GET', lock) or '')
    end
  end
  local debounce_lock
  if debounce_key ~= '' and not refused then
    debounce_lock = prefix .. @key_debounce .. ARGV[i + @type] .. ' ' .. debounce_key
    local holder = replace_waiting(KEYS[@k_scheduled], debounce_lock, now,
                                   rare[@rare_debounce], rare[@rare_debounce_max],
                                   {field, ARGV[i + @payload]},
                                   {{'headers', ARGV[i + @headers]}, {'opts', ARGV[i + @options]},
                                    {'pri', priority}, {'exp', expires_at}, {'fk', fairness}})
    if holder then
      refused = 'debounced:' .. holder
    end
  end
  if refused then
    local o = #out
    out[o + @r_position] = position
    out[o + @r_refusal] = refused
  else
    local due, state = now, 'pending'
    local delay = tonumber(ARGV[i + @delay])
    if delay > 0 then
      due, state = int_text(tonumber(now) + delay), 'scheduled'
    end
    local fields = {'type', ARGV[i + @type], field, ARGV[i + @payload],
                    'state', state,
                    'enq', now, 'due', due}
    if ARGV[i + @headers] ~= '' then
      fields[#fields + 1] = 'headers'
      fields[#fields + 1] = ARGV[i + @headers]
    end
    if ARGV[i + @options] ~= '' then
      fields[#fields + 1] = 'opts'
      fields[#fields + 1] = ARGV[i + @options]
    end
    if own then
      fields[#fields + 1] = 'own'
      fields[#fields + 1] = '1'
    end
    if digest ~= '' then
      fields[#fields + 1] = 'uniq'
      fields[#fields + 1] = digest
    end
    if debounce_lock then
      fields[#fields + 1] = 'dbk'
      fields[#fields + 1] = debounce_key
      redis.call('SET', debounce_lock, id .. ' ' .. now, 'PX',
                 int_text(delay + DEBOUNCE_KEEP_MS))
    end
    if priority ~= '' then
      fields[#fields + 1] = 'pri'
      fields[#fields + 1] = priority
    end
    if expires_at ~= '' then
      fields[#fields + 1] = 'exp'
      fields[#fields + 1] = expires_at
    end
    if fairness ~= '' then
      fields[#fields + 1] = 'fk'
      fields[#fields + 1] = fairness
    end
    local behind = false
    if ordering_key ~= '' then
      fields[#fields + 1] = 'ordk'
      fields[#fields + 1] = ordering_key
      behind = redis.call('RPUSH', prefix .. @key_ordering .. ordering_key, id) > 1
      if behind then
        fields[#fields + 1] = 'ow'
        fields[#fields + 1] = '1'
        redis.call('INCR', prefix .. @key_waiting)
        queue_behind(id, now)
      end
    end
    redis.call('HSET', key, unpack(fields))
    if ARGV[i + @headers] ~= '' and string.find(ARGV[i + @headers], '"obsq-flow"', 1, true) then
      redis.call('HSET', prefix .. @key_watched, id, FLOW_WATCHER)  -- a flow's step (notify_done)
    end
    if behind then
      -- it waits for the tasks ahead of it on its key (release_successor)
    elseif state == 'scheduled' then
      redis.call('ZADD', KEYS[@k_scheduled], due, id)
    elseif priority ~= '' or fairness ~= '' then
      push_pending(KEYS[@k_pending], id, false, priority ~= '' and priority, fairness)
      woken = woken + 1
    else
      pending[#pending + 1] = id
    end
  end
end
call_sliced('LPUSH', KEYS[@k_pending], pending)
wake(KEYS[@k_wake], #pending + woken)
return out
