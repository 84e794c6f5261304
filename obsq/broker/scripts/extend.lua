-- Extend the leases of a worker's running attempts.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns the ids whose lease is no longer this attempt's.
local expires = now_ms() + tonumber(ARGV[@lease])
local ids, _, held = named_attempts(KEYS[@k_active], ARGV[@worker], @items, @stride, @id,
                                       @fence)
local kept, leases, lost = {}, {}, {}
for n, id in ipairs(ids) do
  if held[n] then
    kept[#kept + 1] = id
    leases[#leases + 1] = expires
    leases[#leases + 1] = id
  else
    lost[#lost + 1] = id
  end
end
-- removed, then written again: a first write that cannot grow memory lets a Redis at
-- maxmemory run the script to its end, so a full Redis never takes a running task's lease
call_sliced('ZREM', KEYS[@k_lease], kept)
call_sliced('ZADD', KEYS[@k_lease], leases)
return lost
