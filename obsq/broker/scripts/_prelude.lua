-- Definitions a script may use: each script gets the ones it uses, and the ones those use,
-- prepended (Redis runs them on every call), as scripts.py finds them in its text.
-- A definition is a `local function` (to the `end` at the start of a line) or a one-line
-- `local`, and uses only definitions above it.
-- Constants marked with an at sign come from obsq.settings, written in at load time, and
-- the key names (key_<name>) from obsq/broker/keys.py's KEY_NAMES: the one spelling of a key name.
-- The first key is always a key of one queue ("<ns>:{<queue>}:<name>") or another single
-- key, so every key a script builds is derived from it and shares its hash tag (one cluster
-- slot). A script reads its keys by name, at the constant k_<name> (obsq/broker/wire.py's
-- KEYS); the prefix, whatever the first key's name, is the one read of a key by its number.
local prefix = string.match(KEYS[1], '^.*:')

local function task_key(id)
  return prefix .. @key_task .. id
end

-- Milliseconds from ARGV[1] when the caller drives the clock ('0': it does not), else the
-- server's clock, so that workers and producers on hosts with skewed clocks agree on every
-- due time and lease. As text, the way Redis stores it: joined from TIME's seconds and
-- microseconds, with no number to format (see int_text).
local function now_text()
  local given = ARGV[1]
  if given ~= '0' and (tonumber(given) or 0) > 0 then
    return given
  end
  local t = redis.call('TIME')
  return t[1] .. string.sub('00000' .. t[2], -6, -4)
end

local function now_ms()
  return tonumber(now_text())
end

-- A whole number as the text Redis stores. A number handed to redis.call, or joined with
-- '..', is written by sprintf's '%.17g', a float conversion that costs more than a small
-- Redis call; '%d' costs a tenth of it. Hot paths format a number once and pass the text.
local function int_text(n)
  return string.format('%d', n)
end

-- A record a script cannot read as its place says it is (a task id whose key holds no hash,
-- a pending list of no priority) is set aside in the queue's `junk` hash: its key's name in
-- the queue -> when (ms) and why, the record itself left as found for an operator to read.
-- The script goes on without it and names it in its reply, for its caller to say once;
-- `obsq doctor` lists the junk, and the janitor deletes it with its records once it is as
-- old as the dead tasks it deletes. Returns why.
local function set_aside(name, why, now)
  redis.call('HSET', prefix .. @key_junk, name, int_text(now) .. ' ' .. why)
  return why
end

-- A key of the queue's own (`name`: its name in the queue) found holding something other
-- than `kind` (written outside obsq) holds nothing obsq can read: it is moved, as found, to
-- `aside:<name>` and set aside there, and the script goes on with a fresh key. Returns why.
local function key_aside(name, kind, now)
  local why = 'held a ' .. redis.call('TYPE', prefix .. name).ok .. ', not a ' .. kind
  redis.call('RENAME', prefix .. name, prefix .. @key_aside .. name)
  return set_aside(@key_aside .. name, why, now)
end

-- Task `id`, found in the queue's `where` (a key's name), set aside if its key holds
-- something other than a hash (`kind`: its TYPE, when known): why, else nil.
local function task_aside(id, where, now, kind)
  kind = kind or redis.call('TYPE', task_key(id)).ok
  if kind == 'hash' or kind == 'none' then
    return nil
  end
  return set_aside(@key_task .. id, 'its record is a ' .. kind .. ', not a task hash (found in '
                   .. where .. ')', now)
end

-- Lua's unpack() fails near 8,000 values, so lists of any length go to Redis in slices.
-- SLICE is even: (score, member) and (field, value) pairs are never split.
local SLICE = @LUA_SLICE

-- redis.call(command, key, <values...>), the values in slices (`key` nil: values only).
local function call_sliced(command, key, values)
  for first = 1, #values, SLICE do
    local last = math.min(first + SLICE - 1, #values)
    if key then
      redis.call(command, key, unpack(values, first, last))
    else
      redis.call(command, unpack(values, first, last))
    end
  end
end

local function hmget_sliced(key, fields)
  local out = {}
  for first = 1, #fields, SLICE do
    local got = redis.call('HMGET', key, unpack(fields, first, math.min(first + SLICE - 1,
                                                                          #fields)))
    for i = 1, #got do
      out[#out + 1] = got[i]
    end
  end
  return out
end

-- enqueue.lua's budget of memory below the producers' share: how long a reading lasts, what
-- a task takes beside its strings, and the budget when there is no maxmemory or no INFO.
local MEMORY_LOOK_MS = @MEMORY_LOOK_MS
local TASK_BYTES = 256
local UNCHECKED_BUDGET = 1099511627776  -- 2^40, an integer as Lua writes it (not 1e+15)

-- Whether writing about `cost` bytes would take Redis above `share` of its maxmemory (1: no
-- limit): nil when there is room, else the refusal's text. INFO memory costs more Redis
-- time than a small enqueue, so a reading leaves in the queue's `memok` key a budget of
-- half the room it found below the share, which each caller draws down by what it will
-- write, for MEMORY_LOOK_MS at most (workers and other clients fill memory too); Redis is
-- read again when the budget is spent, so writers however fast never write past the share.
-- The DECRBY cannot be refused below maxmemory (past it, Redis's refusal is the reply). A
-- budget that is not a number (a tampered key) counts as spent: the reading replaces it. A
-- user whose ACL denies INFO goes without the check (an error table, not the text).
local function above_share(share, cost)
  if share >= 1 then
    return nil
  end
  local memok = prefix .. @key_memory_budget
  local left = redis.pcall('DECRBY', memok, int_text(cost))
  if type(left) == 'number' then
    if left >= 0 then
      return nil
    end
  elseif string.find(left.err, 'maxmemory', 1, true) then
    return left.err
  end
  local budget = UNCHECKED_BUDGET
  local memory = redis.pcall('INFO', 'memory')
  if type(memory) == 'string' then
    local limit = tonumber(string.match(memory, 'maxmemory:(%d+)')) or 0
    local used = tonumber(string.match(memory, 'used_memory:(%d+)')) or 0
    if limit > 0 and used > share * limit then
      redis.call('DEL', memok)
      return string.format('used memory is %d%% of maxmemory, above the %d%% producers may fill',
                           math.floor(used * 100 / limit), math.floor(share * 100 + 0.5))
    end
    if limit > 0 then
      budget = math.floor((share * limit - used) / 2) - cost
    end
  end
  redis.call('SET', memok, budget, 'PX', MEMORY_LOOK_MS)
  return nil
end

-- Wake tokens let idle workers block on BLPOP instead of polling; capped so a queue
-- nobody is waiting on does not grow them without bound. A wake key that is not a list (a
-- tampered key) holds no token: it is replaced, after the tasks were written.
local WAKE_CAP = @WAKE_CAP
local function wake(wake_key, n)
  local held = redis.pcall('LLEN', wake_key)
  if type(held) ~= 'number' then
    redis.call('DEL', wake_key)
    held = 0
  end
  local room = WAKE_CAP - held
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

-- Per-task priority, 1 to 9, higher first (0, the default, is `pending` itself): a task of
-- priority p waits in the list `pending:<p>`, kept like `pending`, and the set `levels` names
-- the priorities whose lists may hold tasks (dequeue.lua drops a level it finds empty). The
-- task hash keeps its priority in 'pri' (absent for 0). A queue whose tasks are all of
-- priority 0 writes neither, and costs a fetch one read of the empty set.
local function level_list(pending_key, priority)
  if priority and string.match(priority, '^[1-9]$') then  -- junk written by hand: 0
    return pending_key .. ':' .. priority
  end
  return pending_key
end

-- A member of `levels` that is not 1 to 9 (written by hand) names no list a fetch can rank:
-- it leaves `levels`, and its list is set aside. Returns the list's name and why.
local function level_aside(level, now)
  redis.call('SREM', prefix .. @key_levels, level)
  local name = @key_pending .. ':' .. level
  return name, set_aside(name, "a pending list of priority '" .. level ..
                         "', which is not 1 to 9 (named in levels): not fetched", now)
end

-- The priority lists that may hold tasks, highest first (`pending` not among them).
local function level_lists(pending_key)
  local levels = redis.call('SMEMBERS', prefix .. @key_levels)
  table.sort(levels, function(a, b) return a > b end)  -- single digits: as text
  for i, level in ipairs(levels) do
    levels[i] = pending_key .. ':' .. level
  end
  return levels
end

-- Fairness keys: a pending task with a key ('fk' in its hash) waits in its key's sorted set
-- `fair:<key>`, ordered by priority, then as a pending list is: the handed back first, then
-- in the order they became pending (a place drawn from the counter `fairseq`); `fairring`
-- is the list of the keys with waiting tasks, plus '' standing for the plain pending lists
-- while any key waits, which dequeue.lua rotates (the next turn at the right); `fairkeys`
-- is the sorted set of those keys by their waiting tasks (what the tools show of them), and
-- `fairn` counts the keyed tasks waiting (they count as pending), and `fairage` keeps, for
-- each key, when its task next in line became due (the queue's latency: stats.lua). A queue
-- with no keyed task has no ring: its fetch costs one EXISTS more.
local FAIR_PRIORITY_SPAN = 281474976710656  -- 2^48 places per priority: 9 * 2^48 < 2^53

local function fair_score(priority, first)
  local place = first and 0 or redis.call('INCR', prefix .. @key_fair_places)
  return int_text((9 - (tonumber(priority) or 0)) * FAIR_PRIORITY_SPAN + place)
end

-- `fairage` of key `key`, which has tasks left: when its task next in line became due.
local function next_in_line(key)
  local head = redis.call('ZRANGE', prefix .. @key_fair .. key, 0, 0)[1]
  local due = head and tonumber(redis.call('HGET', task_key(head), 'due'))
  if due then
    redis.call('ZADD', prefix .. @key_fair_age, due, key)
  end
end

-- Task `id` waits under fairness key `key`: at the back of the ring when the key had none.
local function push_fair(id, key, priority, first)
  local set = prefix .. @key_fair .. key
  if redis.call('ZADD', set, fair_score(priority, first), id) == 0 then
    return  -- there already
  end
  redis.call('INCR', prefix .. @key_fair_count)
  if tonumber(redis.call('ZINCRBY', prefix .. @key_fair_waiting, 1, key)) > 1 then
    if first then  -- handed back: next in line now
      next_in_line(key)
    end
  else
    redis.call('ZADD', prefix .. @key_fair_age,
               tonumber(redis.call('HGET', task_key(id), 'due')) or now_ms(), key)
    local ring = prefix .. @key_fair_ring
    if redis.call('EXISTS', ring) == 0 then
      redis.call('LPUSH', ring, '')
    end
    redis.call('LPUSH', ring, key)
  end
end

-- Up to `n` of fairness key `key`'s tasks, the first first, taken out of its set, and
-- whether the key has none left: it then leaves `fairkeys` (the caller takes it out of the
-- ring, and counts the tasks out of `fairn`, once for all it takes).
local function pop_keyed(key, n)
  local popped = redis.call('ZPOPMIN', prefix .. @key_fair .. key, n)
  local ids = {}
  for i = 1, #popped, 2 do
    ids[#ids + 1] = popped[i]
  end
  local waiting = prefix .. @key_fair_waiting
  if #ids == 0 or tonumber(redis.call('ZINCRBY', waiting, -#ids, key)) <= 0 then
    redis.call('ZREM', waiting, key)
    redis.call('ZREM', prefix .. @key_fair_age, key)
    return ids, true
  end
  next_in_line(key)
  return ids, false
end


-- Task `id` joins the pending list of its priority (nil: read from its hash, with its
-- fairness key; false: 0), or, when it has a fairness key (`fairness`), its key's set: at
-- the head when `first` (it was handed back unfinished), else at the tail. A key holding
-- no hash reads as priority 0: the dequeue sets it aside.
local function push_pending(pending_key, id, first, priority, fairness)
  if priority == nil then
    local f = redis.pcall('HMGET', task_key(id), 'pri', 'fk')
    priority, fairness = false, false
    if not f.err then
      priority, fairness = f[1] or false, f[2] or false
    end
  end
  if fairness and fairness ~= '' then
    push_fair(id, fairness, priority, first)
    return
  end
  local list = level_list(pending_key, priority)
  if list ~= pending_key then
    redis.call('SADD', prefix .. @key_levels, priority)
  end
  if first then
    redis.call('RPUSH', list, id)
  else
    redis.call('LPUSH', list, id)
  end
end

-- Pending task `id` (of `priority` and fairness key `fairness`, as its hash keeps them)
-- leaves pending: cancelled or deleted.
local function drop_pending(pending_key, id, priority, fairness)
  if not fairness or fairness == '' then
    redis.call('LREM', level_list(pending_key, priority), 1, id)
    return
  end
  local set = prefix .. @key_fair .. fairness
  if redis.call('ZREM', set, id) > 0 then
    redis.call('DECR', prefix .. @key_fair_count)
    if tonumber(redis.call('ZINCRBY', prefix .. @key_fair_waiting, -1, fairness)) <= 0 then
      redis.call('ZREM', prefix .. @key_fair_waiting, fairness)
      redis.call('ZREM', prefix .. @key_fair_age, fairness)
      redis.call('LREM', prefix .. @key_fair_ring, 1, fairness)
    else
      next_in_line(fairness)
    end
  end
end

-- Makes task `id` pending, due since `due` (ms), in the list of its priority: at the head
-- when it was handed back unfinished (`first`), else at the tail. The caller wakes workers
-- once for the batch.
local function make_pending(pending_key, id, due, first)
  redis.call('HSET', task_key(id), 'state', 'pending', 'due', due)
  push_pending(pending_key, id, first)
end

-- A debounce key's lock, `debounce:<type> <key>`, holds "<id> <ms>": its task, and when its
-- burst of enqueues began. Whether the burst is open is its task's score in `scheduled`
-- (after now), never the lock's life: the lock only names the task, and expires on Redis's
-- own clock DEBOUNCE_KEEP_MS past the task's due time.
local DEBOUNCE_KEEP_MS = 60000

-- A debounced enqueue at `now` (ms, as text) under `lock` (`wait`, `most`: ms): while the
-- lock's task waits in `scheduled_key`, not yet due, the enqueued task's payload (`payload`:
-- its field and value) and options (`options`: {name, value} pairs, '' for none) replace
-- that task's, and it becomes due `wait` after now, or `most` after its burst began if
-- that is sooner. Returns the task's id, else nil: the window closed (the task is due,
-- running or gone), and the enqueued task starts a burst.
local function replace_waiting(scheduled_key, lock, now, wait, most, payload, options)
  local held = redis.call('GET', lock)
  local holder, began = string.match(held or '', '^(%S+) (%d+)$')
  local due = holder and tonumber(redis.call('ZSCORE', scheduled_key, holder))
  if not due or due <= tonumber(now) then
    return nil
  end
  due = tonumber(now) + wait
  if most > 0 then
    due = math.min(due, tonumber(began) + most)
  end
  local key = task_key(holder)
  local fields = {payload[1], payload[2], 'due', int_text(due)}
  local gone = {payload[1] == 'bin' and 'payload' or 'bin'}
  for _, option in ipairs(options) do
    if option[2] == '' then
      gone[#gone + 1] = option[1]
    else
      fields[#fields + 1] = option[1]
      fields[#fields + 1] = option[2]
    end
  end
  redis.call('HDEL', key, unpack(gone))
  redis.call('HSET', key, unpack(fields))
  redis.call('ZADD', scheduled_key, int_text(due), holder)
  redis.call('PEXPIRE', lock, int_text(due - tonumber(now) + DEBOUNCE_KEEP_MS))
  return holder
end

-- The steps of flows (chains, chords) are watched by this pseudo-client from their enqueue
-- (enqueue.lua sees their `obsq-flow` header): their ends land in the queue's
-- `inbox:~flows`, in the same step as the end itself, and stay there (no expiry) until a
-- worker's FlowLoop has recorded them in their flow.
local FLOW_WATCHER = '~flows'

-- Clients waiting in Client.result() are listed in the queue's "watched" hash (task id ->
-- space-separated client ids); each gets the outcome on its inbox list, which its single
-- reader blocks on. `watchers` is that hash's value when the caller read it already.
local function notify_done(id, state, value, watchers)
  if watchers == nil then
    watchers = redis.call('HGET', prefix .. @key_watched, id)
  end
  if not watchers then
    return
  end
  for client in string.gmatch(watchers, '%S+') do
    local inbox = prefix .. @key_inbox .. client
    redis.call('LPUSH', inbox, id .. '\n' .. state .. '\n' .. value)
    if client ~= FLOW_WATCHER then
      redis.call('EXPIRE', inbox, @INBOX_TTL)
    end
  end
  redis.call('HDEL', prefix .. @key_watched, id)
end

-- Each running attempt is recorded in the queue's "active" hash as id -> "<fence>:<worker>".
-- Fencing tokens come from one counter per queue, so a token names one attempt for good.
-- Ends the attempt: true when it still held the task, after removing it from the active
-- hash and the lease set. These writes free memory, so they come first: once a script has
-- written, a Redis at maxmemory lets it finish instead of refusing halfway.
local function release_attempt(active_key, lease_key, id, fence, worker)
  if redis.call('HGET', active_key, id) ~= fence .. ':' .. worker then
    return false
  end
  redis.call('HDEL', active_key, id)
  redis.call('ZREM', lease_key, id)
  return true
end

-- The attempts a batch call names in ARGV from index `first` on, `stride` values each (the
-- id at offset `id_at`, its fence at `fence_at`): their ids and fences, and whether each
-- still holds its task.
local function named_attempts(active_key, worker, first, stride, id_at, fence_at)
  local ids, fences, held = {}, {}, {}
  for i = first, #ARGV, stride do
    ids[#ids + 1] = ARGV[i + id_at]
    fences[#fences + 1] = ARGV[i + fence_at]
  end
  local owners = hmget_sliced(active_key, ids)
  for n = 1, #ids do
    held[n] = owners[n] == fences[n] .. ':' .. worker
  end
  return ids, fences, held
end

-- A task whose producer chose its id ('own') is remembered after obsq forgets it: its id
-- stays in the queue's `ended` zset (id -> the time until which it is remembered, ms) so
-- that enqueue.lua refuses the id within the dedup window; the janitor trims the zset by
-- time and by count. `until_text`: that time, as text.
local function remember_ids(ids, until_text)
  local members = {}
  for _, id in ipairs(ids) do
    members[#members + 1] = until_text
    members[#members + 1] = id
  end
  call_sliced('ZADD', prefix .. @key_ended, members)
end

-- While Redis is above the producers' share of maxmemory (`share`, see above_share), what a
-- settled attempt writes must not grow the data set: on a full Redis of failing tasks their
-- errors and tracebacks, often larger than the tasks, would take Redis far past maxmemory
-- (a script that has written once is never refused). So a failure keeps its error and
-- traceback only while there is room, and otherwise the start of its error with a note,
-- short enough (FULL_ERROR_BYTES) that a small task hash stays in Redis's compact encoding
-- (a worker that was told sends only that much for a while: see Working.retry).
local FULL_NOTE = '@FULL_NOTE'
local FULL_ERROR_BYTES = @FULL_ERROR_BYTES
local function kept_failure(share, error, traceback)
  if #error + #traceback <= FULL_ERROR_BYTES or not above_share(share, #error + #traceback) then
    return error, traceback
  end
  -- no partial UTF-8 sequence at the cut
  local start = string.match(string.sub(error, 1, FULL_ERROR_BYTES - #FULL_NOTE),
                             '^(.-)[\192-\255]?[\128-\191]*$')
  return start .. FULL_NOTE, nil
end

-- Writes a failed attempt's error and traceback (nil or '': none, and an earlier one goes).
local function record_failure(key, error, traceback, fence)
  if traceback and traceback ~= '' then
    redis.call('HSET', key, 'error', error, 'tb', traceback, 'fin', fence)
  else
    redis.call('HSET', key, 'error', error, 'fin', fence)
    redis.call('HDEL', key, 'tb')
  end
end

-- The task hash keeps the fence of the attempt that settled it last ('fin'): a settle
-- re-sent because its reply was lost is then recognised as done, not as a lost lease.
local function settled_by(id, fence)
  return redis.call('HGET', task_key(id), 'fin') == fence
end

-- The opening of a failed attempt's end (fail.lua, retry.lua): the attempt gives its task
-- up, and its error is recorded, cut short above the producers' share (kept_failure).
-- Returns nil, then the error and traceback kept (traceback nil: cut short); or, when the
-- fencing token is stale, the script's reply: 1 when this attempt's earlier, re-sent call
-- was applied, else 0.
local function failed_attempt(active_key, lease_key, id, fence, worker, share, error,
                              traceback)
  if not release_attempt(active_key, lease_key, id, fence, worker) then
    return settled_by(id, fence) and 1 or 0
  end
  error, traceback = kept_failure(tonumber(share), error, traceback)
  record_failure(task_key(id), error, traceback, fence)
  return nil, error, traceback
end
