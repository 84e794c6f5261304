-- What a step's handler reads as task.previous: the results of the steps it waited for.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local f = redis.call('HMGET', KEYS[@k_flow], 'd:' .. ARGV[@step], 'v:' .. ARGV[@step])
local out = {}
out[@r_chord] = f[2] or ''
out[@r_waited] = f[1] or ''
if f[1] then
  local deps = {}
  for dep in string.gmatch(f[1], '%S+') do
    deps[#deps + 1] = dep
  end
  for _, value in ipairs(hmget_sliced(KEYS[@k_results], deps)) do
    out[#out + @r_result] = value
  end
end
return out
