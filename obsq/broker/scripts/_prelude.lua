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

-- A client waiting in Client.result() put the id in the queue's "watched" set; hand it the
-- outcome on a short-lived list it blocks on.
local function notify_done(id, state, value)
  local done = prefix .. 'done:' .. id
  redis.call('LPUSH', done, state .. ':' .. value)
  redis.call('EXPIRE', done, 300)
  redis.call('SREM', prefix .. 'watched', id)
end

-- Each attempt is recorded in the queue's "active" hash as id -> "<fence>:<worker id>".
-- Fencing tokens come from one counter per queue, so a token names one attempt for good.
local function holds(owner, fence, worker)
  return owner == fence .. ':' .. worker
end
