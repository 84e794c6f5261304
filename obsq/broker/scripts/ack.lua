-- Mark a batch of one worker's attempts of one queue completed. Above the producers' share
-- of maxmemory a result longer than FULL_ERROR_BYTES (64) is not kept: its task reads null,
-- with an error saying so.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns per task 1, or 0 when the fencing token is stale (the lease was taken over). A
-- re-sent ack whose attempt already completed the task returns 1: the task hash then holds
-- its fence, or is gone (no retention), as it would be after a takeover that also finished.
local now_stored = now_text()
local now = tonumber(now_stored)
local worker, resent = ARGV[@worker], ARGV[@resent] == '1'
local ids, fences, held = named_attempts(KEYS[@k_active], worker, @items, @stride, @id, @fence)
local out, done = {}, {}
for n, id in ipairs(ids) do
  local fence = fences[n]
  if held[n] then
    out[n] = 1
    done[#done + 1] = n
  elseif settled_by(id, fence) or (resent and redis.call('EXISTS', task_key(id)) == 0) then
    out[n] = 1
  else
    out[n] = 0
  end
end
if #done == 0 then
  return out
end
local finished = {}
for _, n in ipairs(done) do
  finished[#finished + 1] = ids[n]
end
call_sliced('HDEL', KEYS[@k_active], finished)
call_sliced('ZREM', KEYS[@k_lease], finished)
local watchers = hmget_sliced(KEYS[@k_watched], finished)
local gone, forgotten = {}, {}
for j, n in ipairs(done) do
  local i = @items + (n - 1) * @stride
  local id, key = ids[n], task_key(ids[n])
  release_limits(id, ARGV[i + @type], ARGV[i + @slot])
  release_successor(id, ARGV[i + @ordering], now)
  if watchers[j] then
    notify_done(id, 'completed', ARGV[i + @result], watchers[j])
  end
  local retention = tonumber(ARGV[i + @retention])
  if retention > 0 then
    local result = ARGV[i + @result]
    if #result > FULL_ERROR_BYTES and above_share(tonumber(ARGV[@share]), #result) then
      result = 'null'
      redis.call('HSET', key, 'error', 'result not kept: Redis full')
    end
    redis.call('HSET', key, 'state', 'completed', 'result', result, 'done', now_stored,
               'fin', ARGV[i + @fence])
    redis.call('ZADD', KEYS[@k_completed], int_text(now + retention), id)
    redis.call('PEXPIRE', key, int_text(retention + 60000))
  else
    gone[#gone + 1] = key
    if ARGV[i + @own] == '1' then
      forgotten[#forgotten + 1] = id
    end
  end
end
call_sliced('DEL', nil, gone)
if #forgotten > 0 then
  remember_ids(forgotten, int_text(now + tonumber(ARGV[@window])))
end
return out
