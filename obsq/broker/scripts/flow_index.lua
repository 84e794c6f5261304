-- prelude: (none)
-- The namespace's flows (`<ns>:flows`, zset flow id -> when the flow sweep looks at it
-- next, ms): added before a flow is written, looked at by the sweep (launches its flow's
-- steps left launching, then sets the time of its next look: a running flow's a minute on,
-- an ended one's at the end of its retention), removed once its flow is gone.
-- KEYS: the index
-- ARGV: now, 'add' id score | 'due' until count | 'page' offset count | 'set' score id ...
--       | 'remove' id ...
-- Returns 'due': the ids due (at most count); 'page': ids with scores, most recent first.
local mode = ARGV[2]
if mode == 'add' then
  return redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
elseif mode == 'due' then
  return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[3], 'LIMIT', 0, ARGV[4])
elseif mode == 'page' then
  return redis.call('ZRANGE', KEYS[1], ARGV[3], ARGV[3] + ARGV[4] - 1, 'REV', 'WITHSCORES')
elseif mode == 'set' then
  for i = 4, #ARGV do
    redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[i])
  end
  return 1
end
for i = 3, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
end
return 1
