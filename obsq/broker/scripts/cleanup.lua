-- Delete completed tasks past their retention, and dead and cancelled tasks past their age
-- or count limit; the ids their producers chose are remembered for the dedup window from
-- then on. Forget the remembered ids past the window, and the oldest beyond the count cap.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns the number of tasks deleted plus the ids forgotten over the cap (at most a batch
-- of each per call: the caller calls again while a batch was full).
local now = now_ms()
local batch = tonumber(ARGV[@batch])
local deleted = 0
local forgotten = {}
local function drop(set, ids)
  for _, id in ipairs(ids) do
    local key = task_key(id)
    if redis.call('HGET', key, 'own') == '1' then
      forgotten[#forgotten + 1] = id
    end
    redis.call('ZREM', set, id)
    redis.call('DEL', key)
    deleted = deleted + 1
  end
end
drop(KEYS[@k_completed], redis.call('ZRANGEBYSCORE', KEYS[@k_completed], '-inf', now, 'LIMIT', 0,
                                    batch))
for _, set in ipairs({KEYS[@k_dead], KEYS[@k_cancelled]}) do
  drop(set, redis.call('ZRANGEBYSCORE', set, '-inf', now - tonumber(ARGV[@dead_age]), 'LIMIT', 0,
                       batch))
  local excess = redis.call('ZCARD', set) - tonumber(ARGV[@dead_count])
  if excess > 0 then
    drop(set, redis.call('ZRANGE', set, 0, math.min(excess, batch) - 1))
  end
end
if #forgotten > 0 then
  remember_ids(forgotten, int_text(now + tonumber(ARGV[@window])))
end
redis.call('ZREMRANGEBYSCORE', KEYS[@k_ended], '-inf', int_text(now))
local excess = redis.call('ZCARD', KEYS[@k_ended]) - tonumber(ARGV[@max_ids])
if excess > 0 then
  excess = math.min(excess, batch)
  redis.call('ZREMRANGEBYRANK', KEYS[@k_ended], 0, excess - 1)
  deleted = deleted + excess
end
return deleted
