"""The Lua scripts behind every multi-step Redis operation.

Each script is atomic on the server and safe to run twice: redis-py retries
a command whose connection broke, so a script may execute although its
first reply was lost. Every script therefore recognises its own earlier
success (by token, or by the bytes it wrote) instead of reporting failure.

Keys: KEYS[1] is the value, KEYS[2] the lease; both carry the same hash tag.
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "ADD", "COMMIT", "EXTEND", "INCR", "INVALIDATE", "PROBE", "RELEASE", "TOUCH", "WRITE"]

# Reads the value, tolerating a key of another type (foreign data: a miss).
_READ_VALUE = """
local function read_value()
  local v = redis.pcall('GET', KEYS[1])
  if type(v) == 'table' then return false end
  return v
end
"""

# Writes the value with its expiry in milliseconds ('0': none).
_SET_VALUE = """
local function set_value(data, expire_ms)
  if expire_ms == '0' then
    redis.call('SET', KEYS[1], data)
  else
    redis.call('SET', KEYS[1], data, 'PX', expire_ms)
  end
end
"""

# ARGV: token, lease_ms.
# -> {1, value-or-nil} when the caller holds the lease (the value lets it see
#    a rebuild that landed between its read and its lease);
#    {0, lease pttl} when someone else holds it.
ACQUIRE = (
    _READ_VALUE
    + """
local held = redis.call('GET', KEYS[2])
if held == ARGV[1] then return {1, read_value()} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, read_value()}
end
return {0, redis.call('PTTL', KEYS[2])}
"""
)

# The fenced write. ARGV: token, envelope, expire_ms ('0' = never), channel,
# lapsed_since ('' = strict), magic.
# -> 1 written (now or by an earlier run of this same call), 0 rejected.
# With lapsed_since, a lease that lapsed with nobody else holding one still
# writes, unless the stored value was created after lapsed_since (newer).
COMMIT = (
    _READ_VALUE
    + _SET_VALUE
    + """
local held = redis.call('GET', KEYS[2])
if held == ARGV[1] then
  redis.call('DEL', KEYS[2])
else
  local current = read_value()
  if current == ARGV[2] then return 1 end
  if ARGV[5] == '' or held then return 0 end
  if current and string.sub(current, 1, string.len(ARGV[6])) == ARGV[6] and string.len(current) >= 20 then
    local created = struct.unpack('<d', string.sub(current, 13, 20))
    if created > tonumber(ARGV[5]) then return 0 end
  end
end
set_value(ARGV[2], ARGV[3])
redis.call('PUBLISH', ARGV[4], '1')
return 1
"""
)

# Owner-checked release; announces '0' (released without a value) to waiters.
# ARGV: token, channel. -> 1 released, 0 not ours.
RELEASE = """
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  redis.call('PUBLISH', ARGV[2], '0')
  return 1
end
return 0
"""

# Owner-checked renewal. ARGV: token, lease_ms. -> 1 renewed, 0 lost.
EXTEND = """
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 0
"""

# What a waiter checks: -> {value-or-nil, lease pttl (-2: no lease)}.
PROBE = (
    _READ_VALUE
    + """
return {read_value(), redis.call('PTTL', KEYS[2])}
"""
)

# An unconditional write (``set``, ``delete``): cancels any rebuild in flight
# by dropping its lease, so a rebuild that started from older data cannot
# overwrite this write. ARGV: envelope ('' = delete), expire_ms, channel.
# -> 1 written; for a delete, whether there was a value to delete.
WRITE = (
    _SET_VALUE
    + """
redis.call('DEL', KEYS[2])
if ARGV[1] == '' then
  local deleted = redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], '0')
  return deleted
end
set_value(ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], '1')
return 1
"""
)

# Soft invalidation: zero fresh_until in place (the key keeps its TTL and
# payload, so it is served stale while one caller refreshes it) and cancel
# any rebuild in flight, which may have read the data being invalidated.
# ARGV: magic, offset (0-based), 8 bytes of fresh_until. -> 1 marked, 0 absent.
INVALIDATE = """
redis.call('DEL', KEYS[2])
local head = redis.pcall('GETRANGE', KEYS[1], 0, string.len(ARGV[1]) - 1)
if head ~= ARGV[1] then return 0 end
redis.call('SETRANGE', KEYS[1], tonumber(ARGV[2]), ARGV[3])
return 1
"""

# Write only if the key holds nothing (Django's and Flask-Caching's add).
# Wakes waiters: a value has landed. ARGV: envelope, expire_ms, channel.
# -> 1 added, 0 something was there.
ADD = (
    _SET_VALUE
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
set_value(ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], '1')
return 1
"""
)

# New expiry for a value in place: fresh_until in the header and the key's
# TTL. ARGV: magic, offset (0-based), 8 bytes of fresh_until, expire_ms
# ('0' = never). -> 1 touched, 0 nothing of ours there.
TOUCH = """
local head = redis.pcall('GETRANGE', KEYS[1], 0, string.len(ARGV[1]) - 1)
if head ~= ARGV[1] then return 0 end
redis.call('SETRANGE', KEYS[1], tonumber(ARGV[2]), ARGV[3])
if ARGV[4] == '0' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return 1
"""

# Add delta to an integer value in place, keeping its header and TTL.
# Lua numbers are doubles, so the arithmetic is Redis's own INCRBY on a
# scratch key (KEYS[3], same hash tag), read back as text: exact to 64 bits.
# ARGV: magic followed by the integer codec byte, header size, delta.
# -> {1, new value as text}; {0} missing; {-1} not an integer; {-2} overflow.
INCR = """
local v = redis.pcall('GET', KEYS[1])
if not v then return {0} end
if type(v) ~= 'string' or string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return {-1} end
local head = tonumber(ARGV[2])
redis.call('SET', KEYS[3], string.sub(v, head + 1))
local sum = redis.pcall('INCRBY', KEYS[3], ARGV[3])
local text = redis.call('GET', KEYS[3])
redis.call('DEL', KEYS[3])
if type(sum) == 'table' then return {-2} end
redis.call('SET', KEYS[1], string.sub(v, 1, head) .. text, 'KEEPTTL')
return {1, text}
"""
