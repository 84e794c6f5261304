-- Prepended to every script. KEYS[1] is always a key of one queue ("<ns>:{<queue>}:<name>"),
-- so every key a script builds is derived from it and shares its hash tag (one cluster slot).
local prefix = string.match(KEYS[1], '^(.*:)[^:]*$')

local function task_key(id)
  return prefix .. 't:' .. id
end

-- Milliseconds from ARGV[1] when the caller drives the clock, else the server's clock, so
-- that workers on hosts with skewed clocks agree on lease expiry.
local function now_ms()
  local given = tonumber(ARGV[1])
  if given and given > 0 then
    return given
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Wake tokens let idle workers block on BLPOP instead of polling; capped so a queue
-- nobody is waiting on does not grow them without bound.
local WAKE_CAP = 64
local function wake(wake_key, n)
  local room = WAKE_CAP - redis.call('LLEN', wake_key)
  if n > room then
    n = room
  end
  if n > 0 then
    local tokens = {}
    for i = 1, n do
      tokens[i] = '1'
    end
    redis.call('LPUSH', wake_key, unpack(tokens))
  end
end

-- A client waiting in Client.result() set "notify"; hand it the outcome on a short-lived list.
local function notify_done(key, id, state, value)
  if redis.call('HEXISTS', key, 'notify') == 1 then
    local done = prefix .. 'done:' .. id
    redis.call('LPUSH', done, state .. ':' .. value)
    redis.call('EXPIRE', done, 300)
  end
end
