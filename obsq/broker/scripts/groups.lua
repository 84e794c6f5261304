-- prelude: now_ms
-- The task groups of a queue and its batches, a page of each, for the Inspector. Bounded
-- whatever their number: it counts each type's groups (ZCARD) and reads a window by rank
-- of at most `limit` groups and `batch_limit` batches. Groups come by type (sorted), each
-- type's oldest first; batches by the end of their claim, soonest first.
-- KEYS: gtypes, batches
-- ARGV: now, offset, limit, batch offset, batch limit
-- Returns {now, groups in all, next group offset or -1, batches in all, next batch offset
-- or -1, {{type, group, size, oldest task (ms), newest task (ms)}, ...}, {{id, claim end
-- (ms), type, group, ids, owner, failures, error}, ...}}; a batch whose hash is not a hash
-- (written by hand) comes as {id, claim end, false}.
local now = now_ms()
local offset, limit = tonumber(ARGV[@offset]), tonumber(ARGV[@limit])
local batch_offset, batch_limit = tonumber(ARGV[@batch_offset]), tonumber(ARGV[@batch_limit])

local types = redis.call('SMEMBERS', KEYS[1])
table.sort(types)
local groups, total = {}, 0
for _, task_type in ipairs(types) do
  local first_key = prefix .. 'gfirst:' .. task_type
  local n = redis.call('ZCARD', first_key)
  if #groups < limit and total + n > offset then
    local start = math.max(offset - total, 0)
    local raw = redis.call('ZRANGE', first_key, start, start + limit - #groups - 1, 'WITHSCORES')
    for i = 1, #raw, 2 do
      local group = raw[i]
      groups[#groups + 1] = {task_type, group,
                             redis.call('ZSCORE', prefix .. 'gsize:' .. task_type, group) or '',
                             raw[i + 1],
                             redis.call('ZSCORE', prefix .. 'glast:' .. task_type, group) or ''}
    end
  end
  total = total + n
end
local next_offset = -1
if offset + #groups < total and #groups > 0 then
  next_offset = offset + #groups
end

local batches = {}
local batch_total = redis.call('ZCARD', KEYS[2])
local raw = redis.call('ZRANGE', KEYS[2], batch_offset, batch_offset + batch_limit - 1,
                       'WITHSCORES')
for i = 1, #raw, 2 do
  local f = redis.pcall('HMGET', prefix .. 'batch:' .. raw[i], 'type', 'group', 'ids', 'owner',
                        'failures', 'error')
  if f.err then
    batches[#batches + 1] = {raw[i], raw[i + 1], false}
  else
    batches[#batches + 1] = {raw[i], raw[i + 1], f[1] or '', f[2] or '', f[3] or '',
                             f[4] or '', f[5] or '', f[6] or ''}
  end
end
local next_batch = -1
if batch_offset + #batches < batch_total and #batches > 0 then
  next_batch = batch_offset + #batches
end
return {now, total, next_offset, batch_total, next_batch, groups, batches}
