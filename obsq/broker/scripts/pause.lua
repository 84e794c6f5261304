-- Pause or unpause a queue; unpausing wakes idle workers for the tasks that waited.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
if ARGV[@paused] == '1' then
  redis.call('SET', KEYS[@k_paused], 1)
else
  redis.call('DEL', KEYS[@k_paused])
  local waiting = redis.call('LLEN', KEYS[@k_pending]) +
                  (tonumber(redis.call('GET', prefix .. @key_fair_count)) or 0)
  for _, list in ipairs(level_lists(KEYS[@k_pending])) do
    waiting = waiting + redis.call('LLEN', list)
  end
  wake(KEYS[@k_wake], waiting)
end
return 1
