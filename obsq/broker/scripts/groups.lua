-- The task groups of a queue and its batches, a page of each, for the Inspector. Bounded
-- whatever their number: it counts each type's groups (ZCARD) and reads a window by rank
-- of at most `limit` groups and `batch_limit` batches. Groups come by type (sorted), each
-- type's oldest first; batches by the end of their claim, soonest first.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local now = now_ms()
local offset, limit = tonumber(ARGV[@offset]), tonumber(ARGV[@limit])
local batch_offset, batch_limit = tonumber(ARGV[@batch_offset]), tonumber(ARGV[@batch_limit])

-- The offset of the page after `rows`, read from `offset` of `total`; -1 after the last.
local function next_page(offset, rows, total)
  if #rows > 0 and offset + #rows < total then
    return offset + #rows
  end
  return -1
end

local types = redis.call('SMEMBERS', KEYS[@k_group_types])
table.sort(types)
local groups, total = {}, 0
for _, task_type in ipairs(types) do
  local first_key = prefix .. @key_group_firsts .. task_type
  local n = redis.call('ZCARD', first_key)
  if #groups < limit and total + n > offset then
    local start = math.max(offset - total, 0)
    local raw = redis.call('ZRANGE', first_key, start, start + limit - #groups - 1, 'WITHSCORES')
    for i = 1, #raw, 2 do
      local group = raw[i]
      local row = {}
      row[@r_groups_type] = task_type
      row[@r_groups_group] = group
      row[@r_groups_size] = redis.call('ZSCORE', prefix .. @key_group_sizes .. task_type, group) or ''
      row[@r_groups_first] = raw[i + 1]
      row[@r_groups_last] = redis.call('ZSCORE', prefix .. @key_group_lasts .. task_type, group) or ''
      groups[#groups + 1] = row
    end
  end
  total = total + n
end

local batches = {}
local batch_total = redis.call('ZCARD', KEYS[@k_batches])
local raw = redis.call('ZRANGE', KEYS[@k_batches], batch_offset, batch_offset + batch_limit - 1,
                       'WITHSCORES')
for i = 1, #raw, 2 do
  local f = redis.pcall('HMGET', prefix .. @key_batch .. raw[i], 'type', 'group', 'ids', 'owner',
                        'failures', 'error')
  local row = {}
  row[@r_batches_id] = raw[i]
  row[@r_batches_claim_end] = raw[i + 1]
  if not f.err then  -- else the batch's fields end the row: its hash is not a hash
    row[@r_batches_type] = f[1] or ''
    row[@r_batches_group] = f[2] or ''
    row[@r_batches_ids] = f[3] or ''
    row[@r_batches_owner] = f[4] or ''
    row[@r_batches_failures] = f[5] or ''
    row[@r_batches_error] = f[6] or ''
  end
  batches[#batches + 1] = row
end
return {[@r_now] = now, [@r_total] = total, [@r_next_offset] = next_page(offset, groups, total),
        [@r_batch_total] = batch_total,
        [@r_next_batch] = next_page(batch_offset, batches, batch_total),
        [@r_groups] = groups, [@r_batches] = batches}
