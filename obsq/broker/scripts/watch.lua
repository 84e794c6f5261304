-- Client.result(): ask to be told when the task ends, and read its state in the same step
-- so no ending can slip between the two; or, with `watching` 0, stop asking.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns nil when the task does not exist; the state as the hash keeps it (only an ended
-- one counts here: whether the task is active is not read).
local id, client = ARGV[@id], ARGV[@client]
local watchers = redis.call('HGET', KEYS[@k_watched], id)
if ARGV[@watching] == '0' then
  if watchers then
    local rest = {}
    for other in string.gmatch(watchers, '%S+') do
      if other ~= client then
        rest[#rest + 1] = other
      end
    end
    if #rest > 0 then
      redis.call('HSET', KEYS[@k_watched], id, table.concat(rest, ' '))
    else
      redis.call('HDEL', KEYS[@k_watched], id)
    end
  end
  return nil
end
if redis.call('EXISTS', KEYS[@k_task]) == 0 then
  return nil
end
local f = redis.call('HMGET', KEYS[@k_task], 'state', 'result', 'error')
local state = f[1]
if state ~= 'completed' and state ~= 'dead' and state ~= 'cancelled' then
  if not watchers then
    redis.call('HSET', KEYS[@k_watched], id, client)
  elseif not string.find(' ' .. watchers .. ' ', ' ' .. client .. ' ', 1, true) then
    redis.call('HSET', KEYS[@k_watched], id, watchers .. ' ' .. client)
  end
end
return {[@r_state] = state, [@r_result] = f[2], [@r_error] = f[3]}
