-- A queue's flow inbox (`inbox:~flows`: the ends of flow steps, `<id>\n<state>\n<value>`,
-- newest first): read the oldest, or drop those recorded in their flows. Entries leave only
-- once recorded, so a worker killed in between leaves them to the next.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns the entries read, oldest first; or the number dropped.
if ARGV[@mode] == 'read' then
  local entries = redis.call('LRANGE', KEYS[@k_flow_inbox], -tonumber(ARGV[@count]), -1)
  local out = {}
  for i = #entries, 1, -1 do
    out[#out + 1] = entries[i]
  end
  return out
end
local dropped = 0
for i = @entries, #ARGV do
  dropped = dropped + redis.call('LREM', KEYS[@k_flow_inbox], -1, ARGV[i])
end
return dropped
