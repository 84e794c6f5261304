-- Enqueue a batch of tasks into one queue.
-- KEYS: pending, scheduled, wake
-- ARGV: now, then one JSON array holding per task
--       [id, type, payload, headers, options, due_ms, unique_digest, unique_ms]
--       (one argument for the whole batch: cheaper to send than eight per task)
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
    if not redis.call('SET', lock, id, 'NX', 'PX', t[8]) then
      status = 'unique:' .. (redis.call('GET', lock) or '')
    end
  end
  if status == '' then
    local due = t[6]
    local state = 'pending'
    if due > now then
      state = 'scheduled'
    else
      due = now
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
