-- A worker with no handler for the task's type (an older version, in a rolling deploy) hands
-- it on: to the scheduled set, due again a little later, for a worker that knows the type;
-- its retry count stays as it is. Once it has been
-- handed on for longer than `max_age` since its first hand-on ('unk0'), it ends dead. Like a
-- retry, it stays first of its ordering key; one cancelled meanwhile ends cancelled.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 'scheduled' or 'dead' (also when this attempt's earlier, re-sent call was
-- applied: the state it left), or 0 when the fencing token is stale.
local now = now_ms()
local id, fence = ARGV[@id], ARGV[@fence]
local key = task_key(id)
if not release_attempt(KEYS[@k_active], KEYS[@k_lease], id, fence, ARGV[@worker]) then
  return settled_by(id, fence) and redis.call('HGET', key, 'state') or 0
end
release_limits(id, ARGV[@type], ARGV[@slot])
if cancel_requested(id) then
  redis.call('HSET', key, 'fin', fence)
  end_cancelled(id, now)
  return 'cancelled'
end
local first = tonumber(redis.call('HGET', key, 'unk0'))
if not first then
  first = now
  redis.call('HSET', key, 'unk0', first)
end
local count = redis.call('HINCRBY', key, 'unkn', 1)
if now - first >= tonumber(ARGV[@max_age]) then
  local reason = ARGV[@error] .. '; no worker that took it had one within ' ..
      string.format('%g', tonumber(ARGV[@max_age]) / 1000) .. ' s (handed on ' .. count .. ' times)'
  redis.call('HSET', key, 'state', 'dead', 'error', reason, 'done', now, 'fin', fence)
  redis.call('ZADD', KEYS[@k_dead], now, id)
  release_successor(id, ARGV[@ordering], now)
  notify_done(id, 'dead', reason)
  return 'dead'
end
-- due again after a tenth of the time it has been handed on, within [shortest, longest]: soon
-- while a deploy is under way, rarely once no worker has had the type for long
local delay = math.floor(math.min(math.max((now - first) / 10, tonumber(ARGV[@shortest])),
                                  tonumber(ARGV[@longest])))
redis.call('HSET', key, 'state', 'scheduled', 'due', now + delay, 'error', ARGV[@error],
           'fin', fence)
redis.call('ZADD', KEYS[@k_scheduled], now + delay, id)
return 'scheduled'
