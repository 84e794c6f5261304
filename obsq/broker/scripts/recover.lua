-- Take back attempts whose lease expired or whose worker stopped heartbeating. Removing
-- the attempt from the active hash voids its fencing token, so the old attempt can no
-- longer settle the task; one cancelled meanwhile ends cancelled. A lost worker may have
-- run many tasks, and only one of them may have killed it: a task taken back from an
-- attempt that did not run alone becomes a suspect ('sus'), counted against nothing, which
-- its next worker runs alone (isolate.lua marks that attempt in 'iso'). Only the loss of
-- an attempt that ran alone counts against max_recoveries, so only a task that kills its
-- worker by itself ends in dead.
-- With lost workers, one call scans `batch` entries of the active hash from `cursor`; the
-- caller calls again with the returned cursor until it is '0'. A task whose key holds no
-- hash is set aside (set_aside) and named in the reply.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local now = now_ms()
local max_recoveries = tonumber(ARGV[@max_recoveries])
local ids, cursor = {}, '0'
if #ARGV >= @lost then
  local lost = {}
  for i = @lost, #ARGV do
    lost[ARGV[i]] = true
  end
  local scan = redis.call('HSCAN', KEYS[@k_active], ARGV[@cursor], 'COUNT', ARGV[@batch])
  cursor = scan[1]
  for i = 1, #scan[2], 2 do
    if lost[string.match(scan[2][i + 1], '^[^:]*:(.*)$')] then
      ids[#ids + 1] = scan[2][i]
    end
  end
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[@k_lease], '-inf', now, 'LIMIT', 0, ARGV[@batch])
end
local requeued, killed, aside = 0, 0, {}
for _, id in ipairs(ids) do
  local owner = redis.call('HGET', KEYS[@k_active], id)
  redis.call('ZREM', KEYS[@k_lease], id)
  redis.call('HDEL', KEYS[@k_active], id)
  local key = task_key(id)
  local f = redis.pcall('HMGET', key, 'type', 'slot', 'ordk', 'iso')
  if f.err then
    aside[#aside + 1] = {[@r_aside_name] = @key_task .. id,
                         [@r_aside_why] = task_aside(id, @key_lease, now)}
  elseif f[1] then
    release_limits(id, f[1], f[2] or '')
    local alone = f[4] and owner and string.match(owner, '^([^:]*):') == f[4]
    if cancel_requested(id) then
      end_cancelled(id, now)
    elseif alone and redis.call('HINCRBY', key, 'recov', 1) > max_recoveries then
      local reason = 'lost its worker ' .. (max_recoveries + 1) ..
          ' times while it ran alone (max_recoveries ' .. max_recoveries ..
          '): the task kills its worker'
      redis.call('HSET', key, 'state', 'dead', 'error', reason, 'done', now)
      redis.call('ZADD', KEYS[@k_dead], now, id)
      release_successor(id, f[3] or '', now)
      notify_done(id, 'dead', reason)
      killed = killed + 1
    else
      if not alone then
        redis.call('HSET', key, 'sus', '1')
      end
      make_pending(KEYS[@k_pending], id, now, true)
      requeued = requeued + 1
    end
  end
end
wake(KEYS[@k_wake], requeued)
local next_end = redis.call('ZRANGE', KEYS[@k_lease], 0, 0, 'WITHSCORES')
return {[@r_requeued] = requeued, [@r_killed] = killed, [@r_cursor] = cursor,
        [@r_ends_in] = next_end[2] and math.max(tonumber(next_end[2]) - now, 0) or -1,
        [@r_aside] = aside}
