-- prelude: hmget_sliced
-- What a step's handler reads as task.previous: the results of the steps it waited for.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, step
-- Returns {'1' when it is a chord's callback (a list of results) else '', the steps it
-- waited for (space-separated), then their results in order (nil for one not kept)}.
local f = redis.call('HMGET', KEYS[1], 'd:' .. ARGV[@step], 'v:' .. ARGV[@step])
local out = {}
out[@r_chord] = f[2] or ''
out[@r_waited] = f[1] or ''
if f[1] then
  local deps = {}
  for dep in string.gmatch(f[1], '%S+') do
    deps[#deps + 1] = dep
  end
  for _, value in ipairs(hmget_sliced(KEYS[2], deps)) do
    out[#out + @r_result] = value
  end
end
return out
