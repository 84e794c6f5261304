-- Client.result(): ask to be told when the task ends, and read its state in the same step
-- so no ending can slip between the two.
-- KEYS: the task hash (its own first key; this script builds no other key)
-- Returns {state, result, error} or nil when the task does not exist.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return nil
end
redis.call('HSET', KEYS[1], 'notify', 1)
return redis.call('HMGET', KEYS[1], 'state', 'result', 'error')
