-- End a claimed batch. 'done' (its aggregated task is enqueued, under the batch's id)
-- deletes the batch and its grouped tasks (a task cancelled meanwhile stays cancelled)
-- and counts them out of `grouped`,
-- whichever claim says so: the aggregated task exists, so a claim that took over after
-- this one's ran out can only find it a duplicate, and a slow aggregator cannot keep its
-- batch from ending. 'failed' (the aggregator raised or returned junk), only from the
-- claim holding the current fence, keeps every task in the batch, records the error and
-- lets the batch be claimed again after `delay`. The grouped tasks whose producer chose
-- their ids are remembered for the dedup window.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 1 (applied) or 0 (the batch is gone, or a failure from a claim taken over).
local now = now_ms()
local batch = ARGV[@batch]
local key = prefix .. @key_batch .. batch
local f = redis.call('HMGET', key, 'fence', 'ids')
if not f[1] or (ARGV[@outcome] == 'failed' and f[1] ~= ARGV[@fence]) then
  return 0
end
if ARGV[@outcome] == 'failed' then
  redis.call('HINCRBY', key, 'failures', 1)
  redis.call('HSET', key, 'error', ARGV[@error], 'owner', '')
  redis.call('ZADD', KEYS[@k_batches], now + tonumber(ARGV[@delay]), batch)
  return 1
end
redis.call('ZREM', KEYS[@k_batches], batch)
redis.call('DEL', key)
local ended, forgotten = 0, {}
for id in string.gmatch(f[2] or '', '%S+') do
  ended = ended + 1
  local task = task_key(id)
  local g = redis.call('HMGET', task, 'state', 'own')
  if g[1] == 'aggregating' then
    redis.call('DEL', task)
    if g[2] == '1' then
      forgotten[#forgotten + 1] = id
    end
  end
end
if #forgotten > 0 then
  remember_ids(forgotten, int_text(now + tonumber(ARGV[@window])))
end
-- its tasks were counted as aggregating until now (obsq doctor checks the count)
redis.call('DECRBY', prefix .. @key_grouped, ended)
return 1
