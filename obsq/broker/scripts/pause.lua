-- prelude: wake, level_lists
-- Pause or unpause a queue; unpausing wakes idle workers for the tasks that waited.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, 1 (pause) or 0 (unpause)
if ARGV[@paused] == '1' then
  redis.call('SET', KEYS[1], 1)
else
  redis.call('DEL', KEYS[1])
  local waiting = redis.call('LLEN', KEYS[2])
  for _, list in ipairs(level_lists(KEYS[2])) do
    waiting = waiting + redis.call('LLEN', list)
  end
  wake(KEYS[3], waiting)
end
return 1
