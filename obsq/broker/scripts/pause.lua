-- prelude: wake
-- Pause or unpause a queue; unpausing wakes idle workers for the tasks that waited.
-- KEYS: paused, pending, wake
-- ARGV: now, 1 (pause) or 0 (unpause)
if ARGV[@paused] == '1' then
  redis.call('SET', KEYS[1], 1)
else
  redis.call('DEL', KEYS[1])
  wake(KEYS[3], redis.call('LLEN', KEYS[2]))
end
return 1
