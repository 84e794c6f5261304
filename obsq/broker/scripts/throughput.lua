-- Read the outcome counts of one queue's last minutes (written by tally.lua).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns {now, then per minute, the current one first: the count of each outcome}.
local now = now_ms()
local minute = math.floor(now / 60000)
local fields = {}
for i = @outcomes, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local out = {now}
for m = 0, tonumber(ARGV[@minutes]) - 1 do
  local values = redis.call('HMGET', KEYS[@k_stats] .. ':' .. (minute - m), unpack(fields))
  for _, v in ipairs(values) do
    out[#out + 1] = tonumber(v) or 0
  end
end
return out
