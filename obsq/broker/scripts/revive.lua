-- Put tasks of the dead, retry or scheduled set back into pending now (obsq requeue), in
-- bounded steps: the caller repeats the call until nothing is left.
-- A revived dead task starts with a fresh retry count; any revived task counts its losses
-- of a worker and its hand-ons (a type no worker had) afresh. A revived dead task loses its
-- expiry ('exp'): an operator's requeue of a task that expired is a wish to run it.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local now = now_ms()
local ids = {}
if #ARGV >= @ids then
  for i = @ids, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
else
  ids = redis.call('ZRANGE', KEYS[@k_by_state], 0, tonumber(ARGV[@batch]) - 1)
end
local moved = 0
local missing = {}
for _, id in ipairs(ids) do
  local key = task_key(id)
  if redis.call('ZREM', KEYS[@k_by_state], id) == 1 and redis.call('EXISTS', key) == 1 then
    if redis.call('HGET', key, 'state') == 'dead' then
      redis.call('HDEL', key, 'exp')
    end
    redis.call('HSET', key, 'state', 'pending', 'due', now)
    redis.call('HDEL', key, 'done', 'recov', 'unk0', 'unkn', 'sus', 'iso')
    if ARGV[@reset] == '1' then
      redis.call('HDEL', key, 'retried')
    end
    redis.call('PERSIST', key)
    push_pending(KEYS[@k_pending], id, false)
    moved = moved + 1
  else
    missing[#missing + 1] = id
  end
end
if moved > 0 then
  wake(KEYS[@k_wake], moved)
end
local out = {[@r_moved] = moved, [@r_left] = redis.call('ZCARD', KEYS[@k_by_state])}
if #ARGV >= @ids then
  for _, id in ipairs(missing) do
    out[#out + @r_missing] = id
  end
end
return out
