"""The Lua scripts behind every multi-step Redis operation.

Each script is atomic on the server and safe to run twice: redis-py retries
a command whose connection broke, so a script may execute although its
first reply was lost. Every script therefore recognises its own earlier
success (by token, or by the bytes it wrote) instead of reporting failure.

Keys: KEYS[1] is the value, KEYS[2] the lease, KEYS[3] a scratch key, KEYS[4]
the fence (when the key was last deleted or invalidated); all carry the
same hash tag.

Fencing trusts only Redis's clock: every stored value carries, in its header
(see ``stampede._core.envelope``: bytes 2-7, counting from 1 as Lua does),
the server's ``TIME`` when it was written, in milliseconds rounded up, and a
lease reports the server's ``TIME`` when it was won. A commit whose lease
lapsed stores only if nothing was written, deleted or invalidated since then;
two hosts' clocks are never compared.
"""

from __future__ import annotations

from .._core import envelope

__all__ = [
    "ACQUIRE",
    "ADD",
    "BUMP",
    "CAPTURE",
    "COMMIT",
    "EXTEND",
    "FAILED",
    "INCR",
    "INVALIDATE",
    "NAMES",
    "PROBE",
    "RELEASE",
    "SWAP",
    "TOUCH",
    "UNFILLED",
    "WRITE",
    "WRITES",
    "sharded",
]

#: The scripts, by the name an instance calls them (the constant's, in lower case).
NAMES = (
    *("acquire", "commit", "release", "extend", "probe"),
    *("write", "invalidate", "add", "touch", "incr", "swap"),
    *("capture", "bump"),
)
#: The scripts that change a value (the others take, renew or free leases, or read).
WRITES = frozenset({"add", "commit", "incr", "invalidate", "swap", "touch", "write"})

#: What a lease key holds instead of a token once a lease taken by a read
#: ended without a value while the key was missing: a key that reads do not
#: fill (a flag that is normally absent, a marker read and never set). Reads
#: of it then miss at once, without a lease; any write of the key drops it.
#: A token is 32 hex digits, so it can never look like this.
UNFILLED = "!unfilled"

#: What a lease key holds, for a while, after a rebuild under the lease
#: raised: ``!failed:<failures>:<retry_at_ms>:<error>``: the consecutive
#: failures, the server time (ms) before which nobody tries again, and the
#: error as text. Until then, callers with nothing in hand get that error at
#: once and the others serve their stale value; after it, the next lease
#: taken carries the count on (the back-off grows). A token cannot look so.
FAILED = "!failed:"

_UNFILLED = f"""
local UNFILLED = '{UNFILLED}'
local FAILED = '{FAILED}'
local function failed_record(held)
  if type(held) ~= 'string' or string.sub(held, 1, {len(FAILED)}) ~= FAILED then return nil end
  local failures, retry_at, reason = string.match(held, '^!failed:(%d+):(%d+):(.*)$')
  if not failures then return nil end
  return tonumber(failures), tonumber(retry_at), reason
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# The server's clock, in seconds: what orders writes from different hosts.
_NOW = """
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- As text that reads back as the very same double (tostring keeps only 14
-- digits: 0.1 ms, enough for a write just after a lease was won to look
-- older than the lease).
local function server_now_text()
  return string.format('%.17g', server_now())
end
"""

# The envelope's layout (stampede._core.envelope), for the scripts that read
# or change a header in place: a value is ours when its first byte's high
# nibble is KIND; created_at and fresh_until are uint48 at these 1-based
# offsets; a tagged value's tag block starts with its length (uint16).
_LAYOUT = f"""
local KIND, SIGNED, TAGGED = {envelope.KIND}, {envelope.SIGNED}, {envelope.TAGGED}
local COMPRESSED, STALE = {envelope.COMPRESSED}, {envelope.STALE}
local HEADER, CREATED_AT = {envelope.HEADER_SIZE}, {envelope.CREATED_AT_AT + 1}
local CODEC, INT_CODEC = {envelope.CODEC_AT + 1}, {envelope.INT_CODEC}
local FRESH_UNTIL = {envelope.FRESH_UNTIL_AT + 1}
-- The flags of a value of ours, or nil.
local function flags_of(v)
  if type(v) ~= 'string' or string.len(v) < HEADER then return nil end
  local kind = string.byte(v, 1)
  if bit.band(kind, 0xF0) ~= KIND then return nil end
  return bit.band(kind, 0x0F)
end
-- Where a value's payload starts (after its tag block, if tagged).
local function payload_at(v, flags)
  if bit.band(flags, TAGGED) == 0 then return HEADER end
  if string.len(v) < HEADER + 2 then return nil end
  return HEADER + 2 + struct.unpack('<H', string.sub(v, HEADER + 1, HEADER + 2))
end
"""

# Reads the value, tolerating a key of another type (foreign data: a miss).
_READ_VALUE = """
local function read_value()
  local v = redis.pcall('GET', KEYS[1])
  if type(v) == 'table' then return false end
  return v
end
"""

# Writes the value with its expiry in milliseconds ('0': none), stamped with
# the server's clock in the header's created_at field.
_SET_VALUE = (
    _NOW
    + _LAYOUT
    + """
local function stamped(data)
  if not flags_of(data) then return data end
  local t = redis.call('TIME')
  local ms = math.ceil((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
  return string.sub(data, 1, CREATED_AT - 1) .. struct.pack('<I6', ms) .. string.sub(data, CODEC)
end
local function set_value(data, expire_ms)
  if expire_ms == '0' then
    redis.call('SET', KEYS[1], stamped(data))
  else
    redis.call('SET', KEYS[1], stamped(data), 'PX', expire_ms)
  end
end
-- Whether stored bytes are these, whatever their stamp: a retried write.
local function same_value(current, data)
  return current and string.len(current) == string.len(data)
    and string.sub(current, 1, CREATED_AT - 1) == string.sub(data, 1, CREATED_AT - 1)
    and string.sub(current, CODEC) == string.sub(data, CODEC)
end
-- Marks the key deleted or invalidated now, for lapsed commits to see.
local function fence(fence_ms)
  redis.call('SET', KEYS[4], server_now_text(), 'PX', fence_ms)
end
-- Marks it deleted or invalidated as of an earlier time (an owed removal,
-- sent late): the fence only ever moves forward.
local function fence_as_of(fence_ms, as_of)
  local fenced = tonumber(redis.call('GET', KEYS[4]) or '')
  if not fenced or fenced < as_of then
    redis.call('SET', KEYS[4], string.format('%.17g', as_of), 'PX', fence_ms)
  end
end
-- Whether the value whose header is head was written after as_of (server
-- seconds): a removal owed since then does not reach it.
local function written_after(head, as_of)
  if not flags_of(head) then return false end
  return struct.unpack('<I6', string.sub(head, CREATED_AT, CODEC - 1)) / 1000 > as_of
end
-- The header of the value, '' if none (or a key of another type).
local function head_of_value()
  local head = redis.pcall('GETRANGE', KEYS[1], 0, HEADER - 1)
  if type(head) ~= 'string' then return '' end
  return head
end
"""
)

# ARGV: token, lease_ms, reads ('r': the caller is a read, which a key marked
# UNFILLED sends away without a lease; anything else: a rebuild, which has a
# function to fill the key with, so it takes the lease over the mark).
# -> {1, value-or-nil, won-at} when the caller holds the lease (the value
#    lets it see a rebuild that landed between its read and its lease;
#    won-at, the server's clock as text, is what a lapsed commit is fenced by);
#    {0, lease pttl} when someone else holds it; {2, mark pttl} when the key
#    is marked UNFILLED and the caller is a read. (A mark is made on a key
#    its reader found missing, and every write of the key drops it: a value
#    beside a mark is one that reads as missing, deleted by a tag, say.)
ACQUIRE = (
    _READ_VALUE
    + _NOW
    + _UNFILLED
    + """
local held = redis.call('GET', KEYS[2])
if held == UNFILLED then
  if ARGV[3] == 'r' then return {2, redis.call('PTTL', KEYS[2])} end
  redis.call('DEL', KEYS[2])
  held = false
end
local failures = 0
local failed, retry_at, reason = failed_record(held)
if failed then
  local now = now_ms()
  -- A read (its caller rebuilds by itself) is not held back by another's failure.
  if ARGV[3] ~= 'r' and now < retry_at then return {3, retry_at - now, reason, failed} end
  redis.call('DEL', KEYS[2])
  held = false
  failures = failed
end
if held == ARGV[1] or redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, read_value(), server_now_text(), failures}
end
return {0, redis.call('PTTL', KEYS[2])}
"""
)

# The fenced write. ARGV: token, envelope, expire_ms ('0' = never), channel,
# won_at ('' = strict), lapse_ms, held_since (the server time the lease was
# won, '' if unknown: a holder whose key was removed as of a later time, by
# a removal owed through an outage, stores nothing).
# -> 1 written (now or by an earlier run of this same call); {0, value-or-nil}
# rejected, with what the key holds instead (what the caller is served).
# With won_at (the server time the lease was won), a lease that lapsed with
# nobody else holding one still writes, unless since won_at a value was
# written, or the key deleted or invalidated, or the server (re)started, or
# lapse_ms have passed.
COMMIT = (
    _READ_VALUE
    + _SET_VALUE
    + _UNFILLED
    + """
local held = redis.call('GET', KEYS[2])
-- Nobody's lease: a read gave one up without a value after this lease lapsed.
local marked = held == UNFILLED
if marked then held = false end
if held == ARGV[1] then
  redis.call('DEL', KEYS[2])
  local since = tonumber(ARGV[7] or '')
  local fenced = since and redis.call('GET', KEYS[4])
  if fenced and tonumber(fenced) >= since then
    -- Removed as of a time after the lease was won: its rebuild may have
    -- read what was removed. The waiters compete for a new lease.
    redis.call('PUBLISH', ARGV[4], '2')
    return {0, read_value()}
  end
else
  local current = read_value()
  if same_value(current, ARGV[2]) then return 1 end
  local refused = {0, current}
  if ARGV[5] == '' or held then return refused end
  local won_at = tonumber(ARGV[5])
  local now = server_now()
  if now - won_at > tonumber(ARGV[6]) / 1000 then return refused end
  -- A server started since the lease was won (a restart without persistence
  -- forgets fences) cannot vouch that nothing was deleted meanwhile. Uptime
  -- is in whole seconds: a second's margin, on the side of rejecting.
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then return refused end
  local uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
  if not uptime or now - uptime + 1 > won_at then return refused end
  if flags_of(current) then
    -- Rounded up to the millisecond: a write just before the lease may look
    -- later than it (refused, the safe side), never a write after it earlier.
    if struct.unpack('<I6', string.sub(current, CREATED_AT, CODEC - 1)) / 1000 >= won_at then
      return refused
    end
  end
  local fenced = redis.call('GET', KEYS[4])
  if fenced and tonumber(fenced) >= won_at then return refused end
  if marked then redis.call('DEL', KEYS[2]) end
end
set_value(ARGV[2], ARGV[3])
redis.call('PUBLISH', ARGV[4], '1')
return 1
"""
)

# Owner-checked release, announced to waiters: '0' (released without a
# value) or '2' (ARGV[3]: a value was rebuilt but not stored; compete for the
# lease). With ARGV[4] ms (not '0'), the lease of a read that found the key
# missing, whose unit of work ended without writing it: the key is marked
# UNFILLED for that long instead. With ARGV[5] (failures, not ''), the
# rebuild raised: the lease key holds a FAILED record until ARGV[6] ms from
# now have passed, kept ARGV[7] ms more (the count's memory), with ARGV[8]
# (the error as text). ARGV: token, channel, announcement, unfilled_ms,
# failures, back-off ms, keep ms, error. -> 1 released, 0 not ours.
RELEASE = (
    _UNFILLED
    + """
if redis.call('GET', KEYS[2]) == ARGV[1] then
  if ARGV[5] and ARGV[5] ~= '' then
    local retry_at = now_ms() + tonumber(ARGV[6])
    local record = FAILED .. ARGV[5] .. ':' .. retry_at .. ':' .. ARGV[8]
    redis.call('SET', KEYS[2], record, 'PX', tonumber(ARGV[6]) + tonumber(ARGV[7]))
  elseif ARGV[4] and ARGV[4] ~= '0' then
    redis.call('SET', KEYS[2], UNFILLED, 'PX', ARGV[4])
  else
    redis.call('DEL', KEYS[2])
  end
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
"""
)

# Owner-checked renewal. ARGV: token, lease_ms. -> 1 renewed, 0 lost.
EXTEND = """
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 0
"""

# What a waiter checks: -> {value-or-nil, lease pttl (-2: no lease, nor
# anything but an UNFILLED mark; -3: a FAILED record: the rebuild raised)}.
# Reading the lease (GET, not only PTTL) marks it used: under an LRU
# maxmemory policy a lease that many wait on is not the first key evicted.
PROBE = (
    _READ_VALUE
    + _UNFILLED
    + """
local held = redis.call('GET', KEYS[2])
if held == UNFILLED then return {read_value(), -2} end
if failed_record(held) then return {read_value(), -3} end
return {read_value(), redis.call('PTTL', KEYS[2])}
"""
)

# An unconditional write (``set``, ``delete``): cancels any rebuild in flight
# by dropping its lease, so a rebuild that started from older data cannot
# overwrite this write (nor, if its lease lapsed, store after it: a set's
# value is stamped, a delete leaves a fence). ARGV: envelope ('' = delete),
# expire_ms, channel, fence_ms, as_of (a delete's, optional: see below). -> 1
# written; for a delete, whether there was a value to delete.
WRITE = (
    _SET_VALUE
    + """
if ARGV[1] == '' and (ARGV[5] or '') ~= '' then
  -- A delete owed through an outage, as of when it was asked: what was
  -- written since stays, and so does the lease (fenced: a holder that won
  -- it before then stores nothing).
  local as_of = tonumber(ARGV[5])
  fence_as_of(ARGV[4], as_of)
  if written_after(head_of_value(), as_of) then return 0 end
  return redis.call('DEL', KEYS[1])
end
redis.call('DEL', KEYS[2])
if ARGV[1] == '' then
  local deleted = redis.call('DEL', KEYS[1])
  fence(ARGV[4])
  -- '2', not '0': the lease was cancelled, not given up, so the waiters
  -- compete for a new one rather than each rebuild alone.
  redis.call('PUBLISH', ARGV[3], '2')
  return deleted
end
set_value(ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], '1')
return 1
"""
)

# Soft invalidation: set the value's stale flag in place (it keeps its TTL
# and payload, so it is served stale while one caller refreshes it) and
# cancel any rebuild in flight, which may have read the data being
# invalidated. ARGV: fence_ms, as_of (server seconds, optional: owed
# through an outage, as of when it was asked; what was written since stays
# fresh, and so does the lease, fenced). -> 1 marked, 0 absent.
INVALIDATE = (
    _SET_VALUE
    + """
local as_of = tonumber(ARGV[2] or '')
if as_of then
  fence_as_of(ARGV[1], as_of)
else
  redis.call('DEL', KEYS[2])
  fence(ARGV[1])
end
local head = head_of_value()
local flags = flags_of(head)
if not flags then return 0 end
if as_of and written_after(head, as_of) then return 0 end
if bit.band(flags, STALE) == 0 then
  redis.call('SETRANGE', KEYS[1], 0, string.char(KIND + flags + STALE))
end
return 1
"""
)

# Write only if the key holds nothing (Django's and Flask-Caching's add).
# Wakes waiters: a value has landed. ARGV: envelope, expire_ms, channel.
# -> 1 added, 0 something was there.
ADD = (
    _SET_VALUE
    + _UNFILLED
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('GET', KEYS[2]) == UNFILLED then redis.call('DEL', KEYS[2]) end
set_value(ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], '1')
return 1
"""
)

# New expiry for an unsigned value in place: fresh_until in the header (and
# the stale flag cleared) and the key's TTL. ARGV: 6 bytes of fresh_until,
# expire_ms ('0' = never). -> the header and tag block of the value touched
# (for the caller to judge its tags), 0 nothing of ours there.
TOUCH = (
    _LAYOUT
    + """
local v = redis.pcall('GET', KEYS[1])
local flags = flags_of(v)
if not flags or bit.band(flags, SIGNED) ~= 0 then return 0 end
local head = payload_at(v, flags)
if not head then return 0 end
local kind = string.char(KIND + bit.band(flags, 0x0F - STALE))
redis.call('SETRANGE', KEYS[1], 0, kind)
redis.call('SETRANGE', KEYS[1], FRESH_UNTIL - 1, ARGV[1])
if ARGV[2] == '0' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return string.sub(v, 1, head)
"""
)

# Add delta to an unsigned integer value in place, keeping its header
# (restamped) and TTL. Lua numbers are doubles, so the arithmetic is Redis's
# own INCRBY on a scratch key (KEYS[3], same hash tag), read back as text:
# exact to 64 bits. ARGV: delta.
# -> {1, new value as text, the header and tag block (for the caller to judge
# its tags)}; {0} missing; {-1} not an integer; {-2} overflow.
INCR = (
    _SET_VALUE
    + """
local v = redis.pcall('GET', KEYS[1])
if not v then return {0} end
local flags = flags_of(v)
if not flags or bit.band(flags, SIGNED + COMPRESSED) ~= 0 or string.byte(v, CODEC) ~= INT_CODEC then
  return {-1}
end
local head = payload_at(v, flags)
if not head then return {-1} end
redis.call('SET', KEYS[3], string.sub(v, head + 1))
local sum = redis.pcall('INCRBY', KEYS[3], ARGV[1])
local text = redis.call('GET', KEYS[3])
redis.call('DEL', KEYS[3])
if type(sum) == 'table' then return {-2} end
-- A write like any other: stamped, and the rebuild in flight (which read
-- the value before it) loses its lease, so its commit cannot undo this.
redis.call('SET', KEYS[1], stamped(string.sub(v, 1, head) .. text), 'KEEPTTL')
redis.call('DEL', KEYS[2])
return {1, text, string.sub(v, 1, head)}
"""
)

# Compare-and-set, for the changes to a signed value that only the client can
# sign (``incr``, ``touch``): replace the value only if it still is ``old``.
# ARGV: old, new, expire_ms ('' = keep the TTL as INCR does, restamp and cancel
# the rebuild in flight; otherwise TOUCH's: '0' = never, keep the stamp).
# -> 1 replaced; {0, value-or-nil} it changed meanwhile (what it holds now).
SWAP = (
    _READ_VALUE
    + _SET_VALUE
    + """
local current = read_value()
if not same_value(current, ARGV[1]) then return {0, current} end
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], stamped(ARGV[2]), 'KEEPTTL')
  redis.call('DEL', KEYS[2])
  return 1
end
local data = string.sub(ARGV[2], 1, CREATED_AT - 1) .. string.sub(current, CREATED_AT, CODEC - 1)
  .. string.sub(ARGV[2], CODEC)
if ARGV[3] == '0' then
  redis.call('SET', KEYS[1], data)
else
  redis.call('SET', KEYS[1], data, 'PX', ARGV[3])
end
return 1
"""
)


# The server's clock in milliseconds, as text: a tag's versions.
_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function text(n) return string.format('%.0f', n) end
"""

# What a rebuild records of a tag before it reads its data: the tag's state
# ("<current>:<deleted>:<when last bumped, server microseconds>"), made if
# missing, and kept at least keep_ms more ('0': forever), to outlive the entry.
# KEYS[1]: the tag's state key. ARGV: keep_ms.
CAPTURE = (
    _NOW_MS
    + """
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' or not string.match(v, '^%d+:%d+:%d+$') then
  v = text(now_ms()) .. ':0:0'
  if ARGV[1] == '0' then
    redis.call('SET', KEYS[1], v)
  else
    redis.call('SET', KEYS[1], v, 'PX', ARGV[1])
  end
  return v
end
if ARGV[1] == '0' then
  redis.call('PERSIST', KEYS[1])
else
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
end
return v
"""
)

# Invalidate a tag (ARGV[1] 'soft': its entries turn stale) or delete it
# ('hard': they read as missing): its current version rises to the server's
# clock (at least by one), and with 'hard' its deleted version too; the time
# of the bump (server microseconds) is kept beside them. A missing state is
# made: for the namespace (ARGV[2] '1') for good; for a tag, for ARGV[3] ms
# (no entry records it, but a lease won before this bump and committed with
# the tag later must find out when it was bumped). KEYS[1]: the state key.
# -> the new state.
BUMP = (
    _NOW_MS
    + """
local v = redis.pcall('GET', KEYS[1])
local current, deleted = 0, 0
local found = type(v) == 'string' and string.match(v, '^%d+:%d+:%d+$')
if found then
  local c, d = string.match(v, '^(%d+):(%d+):')
  current, deleted = tonumber(c), tonumber(d)
end
current = math.max(current + 1, now_ms())
if ARGV[1] == 'hard' then deleted = current end
local state = text(current) .. ':' .. text(deleted) .. ':' .. text(now_us())
if found then
  redis.call('SET', KEYS[1], state, 'KEEPTTL')
elseif ARGV[2] == '1' then
  redis.call('SET', KEYS[1], state)
else
  redis.call('SET', KEYS[1], state, 'PX', ARGV[3])
end
return state
"""
)


def sharded(script: str) -> str:
    """``script`` publishing with ``SPUBLISH`` (sharded pub/sub: Redis 7+,
    Valkey) instead of ``PUBLISH``; its channel shares its keys' hash tag."""
    return script.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")
