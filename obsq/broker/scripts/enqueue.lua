-- prelude: now_ms, task_key, call_sliced, wake
-- Enqueue a batch of tasks into one queue.
-- KEYS: pending, scheduled, wake
-- ARGV: now, then one JSON array holding per task
--       [id, type, payload, headers, options, delay_ms, unique_digest, unique_ms,
--        ordering key or ''] (a task whose key has tasks already waits behind them)
--       (one argument for the whole batch: cheaper to send than eight per task). The delay
--       is added to the server's clock here, so a producer's clock never decides a due time.
-- Returns per task: '' (enqueued), 'id' (the id exists) or 'unique:<id of the holder>'.
local now = now_ms()
local out = {}
local pending = {}
for _, t in ipairs(cjson.decode(ARGV[2])) do
  local id = t[1]
  local key = task_key(id)
  local status = ''
  local digest = t[7]
  if redis.call('EXISTS', key) == 1 then
    status = 'id'
  elseif digest ~= '' then
    local lock = prefix .. 'unique:' .. digest
    if not redis.call('SET', lock, id, 'NX', 'PX', math.max(t[8], 1)) then
      status = 'unique:' .. (redis.call('GET', lock) or '')
    end
  end
  if status == '' then
    local due, state = now, 'pending'
    if t[6] > 0 then
      due, state = now + t[6], 'scheduled'
    end
    local fields = {'type', t[2], 'payload', t[3], 'state', state, 'enq', now, 'due', due}
    if t[4] ~= '' then
      fields[#fields + 1] = 'headers'
      fields[#fields + 1] = t[4]
    end
    if t[5] ~= '{}' then
      fields[#fields + 1] = 'opts'
      fields[#fields + 1] = t[5]
    end
    if digest ~= '' then
      fields[#fields + 1] = 'uniq'
      fields[#fields + 1] = digest
    end
    local behind = false
    if t[9] ~= '' then
      fields[#fields + 1] = 'ordk'
      fields[#fields + 1] = t[9]
      behind = redis.call('RPUSH', prefix .. 'ord:' .. t[9], id) > 1
      if behind then
        fields[#fields + 1] = 'ow'
        fields[#fields + 1] = '1'
        redis.call('INCR', prefix .. 'waiting')
      end
    end
    redis.call('HSET', key, unpack(fields))
    if behind then
      -- it waits for the tasks ahead of it on its key (release_successor)
    elseif state == 'scheduled' then
      redis.call('ZADD', KEYS[2], due, id)
    else
      pending[#pending + 1] = id
    end
  end
  out[#out + 1] = status
end
call_sliced('LPUSH', {KEYS[1]}, pending)
wake(KEYS[3], #pending)
return out
