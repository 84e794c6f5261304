-- What is left for a worker in one queue (obsq.testing waits for none): the tasks it could
-- take now (none while the queue is paused; held and ordering-key tasks are not in pending)
-- and the attempts it holds.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns their count.
local left = 0
if redis.call('EXISTS', KEYS[@k_paused]) == 0 then
  left = redis.call('LLEN', KEYS[@k_pending]) +
         (tonumber(redis.call('GET', prefix .. @key_fair_count)) or 0)
  for _, list in ipairs(level_lists(KEYS[@k_pending])) do
    left = left + redis.call('LLEN', list)
  end
end
local mine = ':' .. ARGV[@worker]
for _, owner in ipairs(redis.call('HVALS', KEYS[@k_active])) do
  if string.sub(owner, -#mine) == mine then
    left = left + 1
  end
end
return left
