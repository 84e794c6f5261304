-- Delete completed tasks past their retention, and dead and cancelled tasks past their age
-- or count limit; the ids their producers chose are remembered for the dedup window from
-- then on. Forget the remembered ids past the window, and the oldest beyond the count cap.
-- A task whose key holds no hash is set aside (set_aside) and named in the reply; the junk
-- set aside before dead_age is deleted, its records with it.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- `deleted`: the number of tasks deleted or set aside plus the ids forgotten over the cap (at
-- most a batch of each per call: the caller calls again while a batch was full).
local now = now_ms()
local batch = tonumber(ARGV[@batch])
local deleted = 0
local forgotten, aside = {}, {}
local function drop(set, ids)
  local where = string.sub(set, #prefix + 1)
  for _, id in ipairs(ids) do
    local key = task_key(id)
    local own = redis.pcall('HGET', key, 'own')
    redis.call('ZREM', set, id)
    if type(own) == 'table' then  -- an error: its key holds no hash
      aside[#aside + 1] = {[@r_aside_name] = @key_task .. id,
                           [@r_aside_why] = task_aside(id, where, now)}
    else
      if own == '1' then
        forgotten[#forgotten + 1] = id
      end
      redis.call('DEL', key)
    end
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
-- the junk's records are only those set_aside names: a task's key, a pending list of no
-- priority, a key moved aside (an entry naming anything else goes alone)
local junk = prefix .. @key_junk
local found = redis.call('HSCAN', junk, 0, 'COUNT', batch)[2]
for i = 1, #found, 2 do
  local name, at = found[i], tonumber(string.match(found[i + 1], '^%d+'))
  if not at or at < now - tonumber(ARGV[@dead_age]) then
    if string.sub(name, 1, #@key_task) == @key_task or
        string.sub(name, 1, #@key_aside) == @key_aside or
        (string.match(name, '^' .. @key_pending .. ':') and not string.match(name, ':[1-9]$')) then
      redis.call('DEL', prefix .. name)
    end
    redis.call('HDEL', junk, name)
  end
end
return {[@r_deleted] = deleted, [@r_aside] = aside}
