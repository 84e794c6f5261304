-- Hand a worker's unfinished attempts back to the head of pending (graceful shutdown, or a
-- prefetch buffer given back); one cancelled meanwhile ends cancelled. Each keeps its due
-- time (its age, its rank among priorities), and the last given is pushed last: it is
-- taken first, so ids given in their order back to front keep their order.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns per task 1, or 0 when the fencing token is stale.
local now = now_ms()
local out = {}
local pushed = 0
for i = @items, #ARGV, @stride do
  local id = ARGV[i + @id]
  if release_attempt(KEYS[@k_active], KEYS[@k_lease], id, ARGV[i + @fence], ARGV[@worker]) then
    release_limits(id, ARGV[i + @type], ARGV[i + @slot])
    if cancel_requested(id) then
      end_cancelled(id, now)
    else
      make_pending(KEYS[@k_pending], id, redis.call('HGET', task_key(id), 'due') or now, true)
      pushed = pushed + 1
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
wake(KEYS[@k_wake], pushed)
return out
