-- Enqueue a batch of tasks into one queue.
-- KEYS: pending, scheduled, wake
-- ARGV: now, then per task: id, type, payload, headers, options, due_ms, unique_digest, unique_ms
-- Returns per task: '' (enqueued), 'id' (the id exists) or 'unique:<id of the holder>'.
local now = now_ms()
local out = {}
local pending = {}
for i = 2, #ARGV, 8 do
  local id = ARGV[i]
  local key = task_key(id)
  local status = ''
  local digest = ARGV[i + 6]
  if redis.call('EXISTS', key) == 1 then
    status = 'id'
  elseif digest ~= '' then
    local lock = prefix .. 'unique:' .. digest
    if not redis.call('SET', lock, id, 'NX', 'PX', ARGV[i + 7]) then
      status = 'unique:' .. (redis.call('GET', lock) or '')
    end
  end
  if status == '' then
    local due = tonumber(ARGV[i + 5])
    local state = 'pending'
    if due > now then
      state = 'scheduled'
    else
      due = now
    end
    local fields = {'type', ARGV[i + 1], 'payload', ARGV[i + 2], 'state', state,
                    'enq', now, 'due', due}
    if ARGV[i + 3] ~= '' then
      fields[#fields + 1] = 'headers'
      fields[#fields + 1] = ARGV[i + 3]
    end
    if ARGV[i + 4] ~= '{}' then
      fields[#fields + 1] = 'opts'
      fields[#fields + 1] = ARGV[i + 4]
    end
    if digest ~= '' then
      fields[#fields + 1] = 'uniq'
      fields[#fields + 1] = digest
    end
    redis.call('HSET', key, unpack(fields))
    if state == 'scheduled' then
      redis.call('ZADD', KEYS[2], due, id)
    else
      pending[#pending + 1] = id
    end
  end
  out[#out + 1] = status
end
if #pending > 0 then
  redis.call('LPUSH', KEYS[1], unpack(pending))
  wake(KEYS[3], #pending)
end
return out
