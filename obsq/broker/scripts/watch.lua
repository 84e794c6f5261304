-- Client.result(): ask to be told when the task ends, and read its state in the same step
-- so no ending can slip between the two.
-- KEYS: active, watched, the task hash
-- ARGV: now, id
-- Returns {state, result, error} or nil when the task does not exist.
if redis.call('EXISTS', KEYS[3]) == 0 then
  return nil
end
local f = redis.call('HMGET', KEYS[3], 'state', 'result', 'error')
if f[1] ~= 'completed' and f[1] ~= 'dead' then
  redis.call('SADD', KEYS[2], ARGV[2])
  if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
    f[1] = 'active'
  end
end
return f
