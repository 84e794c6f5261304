-- Hand back to the head of pending the tasks leased to a worker that it does not hold: a
-- fetch whose reply it never read (its deadline fired, or the connection dropped, after
-- Redis ran the fetch) left them leased to it, where they would wait for their lease to
-- run out. `held` names every attempt the worker holds in the queue (id, fence); an entry
-- of the active hash that names the worker with any other fence is such a fetch's. The
-- worker calls it from its fetch loop before it fetches again, so no fetch whose reply it
-- still awaits is taken for a lost one. Each keeps its due time, as hand_back.lua's; one
-- cancelled meanwhile ends cancelled. One call scans `batch` entries of the active hash
-- from `cursor`; the caller calls again with the returned cursor until it is '0'. A task
-- whose key holds no hash is set aside (set_aside) and named in the reply.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local now = now_ms()
local held = {}
for i = @items, #ARGV, @stride do
  held[ARGV[i + @id]] = ARGV[i + @fence]
end
local scan = redis.call('HSCAN', KEYS[@k_active], ARGV[@cursor], 'COUNT', ARGV[@batch])
local released, pushed, aside = 0, 0, {}
for i = 1, #scan[2], 2 do
  local id = scan[2][i]
  local fence, worker = string.match(scan[2][i + 1], '^([^:]*):(.*)$')
  if worker == ARGV[@worker] and held[id] ~= fence then
    redis.call('HDEL', KEYS[@k_active], id)
    redis.call('ZREM', KEYS[@k_lease], id)
    released = released + 1
    local f = redis.pcall('HMGET', task_key(id), 'type', 'slot', 'due')
    if f.err then
      aside[#aside + 1] = {[@r_aside_name] = @key_task .. id,
                           [@r_aside_why] = task_aside(id, @key_lease, now)}
    elseif f[1] then
      release_limits(id, f[1], f[2] or '')
      if cancel_requested(id) then
        end_cancelled(id, now)
      else
        make_pending(KEYS[@k_pending], id, f[3] or now, true)
        pushed = pushed + 1
      end
    end
  end
end
wake(KEYS[@k_wake], pushed)
return {[@r_released] = released, [@r_cursor] = scan[1], [@r_aside] = aside}
