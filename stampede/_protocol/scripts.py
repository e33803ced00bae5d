"""The Lua scripts behind every multi-step Redis operation.

Each script is atomic on the server and safe to run twice: redis-py retries
a command whose connection broke, so a script may execute although its
first reply was lost. Every script therefore recognises its own earlier
success (by token, or by the bytes it wrote) instead of reporting failure.

Keys: KEYS[1] is the value, KEYS[2] its lease, KEYS[3] a scratch key; all
carry the same hash tag.

A lease key holds a record, ``<token>:<held until>:<won at>:<holder>`` (the
server's clock, in milliseconds; the holder's ``host:pid``, for operators to
see, decides nothing): the lease is held until ``held until`` (renewed by
EXTEND), and the key itself lives ``lapse_ms`` from when the lease was won,
as long as its holder may still store. A commit stores only while its own
record is there: positive evidence that nothing was written, deleted or
invalidated since the lease was won, since every write of the key deletes
the record, and that no other caller took the key over. Whatever else makes
the record vanish (an eviction under ``maxmemory``, a restart without
persistence, a flush, the end of ``lapse_ms``) refuses the commit too: a
missing record is never read as "nothing happened". Two hosts' clocks are
never compared.

Every stored value carries, in its header (see ``stampede._core.envelope``:
bytes 2-7, counting from 1 as Lua does), the server's ``TIME`` when it was
written, in milliseconds rounded up: what a removal owed through an outage
compares with when it was asked.
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
-- A lease record's token, held-until and won-at (ms) and holder
-- ('host:pid', or ''), or nil.
local function lease_record(held)
  if type(held) ~= 'string' then return nil end
  local token, until_ms, won_ms, holder = string.match(held, '^(%x+):(%d+):(%d+):?(.*)$')
  if not token then return nil end
  return token, tonumber(until_ms), tonumber(won_ms), holder
end
local function make_record(token, until_ms, won_ms, holder)
  local record = token .. ':' .. string.format('%.0f', until_ms) .. ':' .. string.format('%.0f', won_ms)
  if holder and holder ~= '' then record = record .. ':' .. holder end
  return record
end
-- How long (ms) what the lease key holds keeps others from the lease: a
-- record, until its time; foreign data, while it lives if it expires (data
-- that never expires is taken over: nothing would ever free it). 0: free
-- (nothing, a mark, a failed record: those have rules of their own).
local function held_left(held, now)
  if not held or held == UNFILLED or failed_record(held) then return 0 end
  local token, until_ms = lease_record(held)
  if token then return math.max(until_ms - now, 0) end
  return math.max(redis.call('PTTL', KEYS[2]), 0)
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
    _LAYOUT
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
# function to fill the key with, so it takes the lease over the mark),
# record_ms (how long the record is kept: as long as its holder may store),
# holder ('host:pid', shown to operators; the token alone decides).
# -> {1, value-or-nil, won-at, failures} when the caller holds the lease (the
#    value lets it see a rebuild that landed between its read and its lease;
#    won-at is the server's clock as text, seconds); {0, ms left} when
#    someone else holds it; {2, mark pttl} when the key is marked UNFILLED and
#    the caller is a read (a mark is made on a key its reader found missing,
#    and every write of the key drops it: a value beside a mark is one that
#    reads as missing, deleted by a tag, say); {3, retry in ms, error,
#    failures} when the last rebuild raised. A lapsed lease is taken over,
#    and so is foreign data that never expires (foreign data that does
#    counts as a lease held until then).
ACQUIRE = (
    _READ_VALUE
    + _UNFILLED
    + """
local held = redis.call('GET', KEYS[2])
if held == UNFILLED then
  if ARGV[3] == 'r' then return {2, redis.call('PTTL', KEYS[2])} end
  held = false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local failures = 0
local failed, retry_at, reason = failed_record(held)
if failed then
  -- A read (its caller rebuilds by itself) is not held back by another's failure.
  if ARGV[3] ~= 'r' and now < retry_at then return {3, retry_at - now, reason, failed} end
  failures = failed
end
if lease_record(held) ~= ARGV[1] then
  local left = held_left(held, now)
  if left > 0 then return {0, left} end
end
redis.call('SET', KEYS[2], make_record(ARGV[1], now + tonumber(ARGV[2]), now, ARGV[5]), 'PX', ARGV[4])
return {1, read_value(), string.format('%d.%06d', tonumber(t[1]), tonumber(t[2])), failures}
"""
)

# The fenced write: stores only while the caller's own lease record is there
# (see above). ARGV: token, envelope, expire_ms ('0' = never), channel,
# lapsed ('1': store although the lease lapsed, its record being there still;
# '': only while it is held). -> 1 written (now or by an earlier run of this
# same call); {0, value-or-nil} refused, with what the key holds instead
# (what the caller is served).
COMMIT = (
    _READ_VALUE
    + _SET_VALUE
    + _UNFILLED
    + """
local token, until_ms = lease_record(redis.call('GET', KEYS[2]))
if token == ARGV[1] then
  redis.call('DEL', KEYS[2])
  if ARGV[5] == '1' or now_ms() < until_ms then
    set_value(ARGV[2], ARGV[3])
    redis.call('PUBLISH', ARGV[4], '1')
    return 1
  end
  -- Lapsed, and the caller stores only under a lease held: the key is free.
  return {0, read_value()}
end
local current = read_value()
if same_value(current, ARGV[2]) then return 1 end
return {0, current}
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
if lease_record(redis.call('GET', KEYS[2])) == ARGV[1] then
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

# Owner-checked renewal: held for lease_ms more. A lapsed lease whose record
# is still there is the caller's still (nobody wrote the key or took it
# over since): renewed too. The record's own expiry stays. ARGV: token,
# lease_ms. -> 1 renewed, 0 lost.
EXTEND = (
    _UNFILLED
    + """
local token, _, won_ms, holder = lease_record(redis.call('GET', KEYS[2]))
if token ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], make_record(token, now_ms() + tonumber(ARGV[2]), won_ms, holder), 'KEEPTTL')
return 1
"""
)

# What a waiter checks: -> {value-or-nil, ms the lease is held for still
# (-2: no lease held, nor anything but an UNFILLED mark; -3: a FAILED
# record: the rebuild raised)}. Reading the lease (GET) marks it used: under
# an LRU maxmemory policy a lease that many wait on is not the first key
# evicted.
PROBE = (
    _READ_VALUE
    + _UNFILLED
    + """
local held = redis.call('GET', KEYS[2])
if failed_record(held) then return {read_value(), -3} end
local left = held_left(held, now_ms())
if left <= 0 then return {read_value(), -2} end
return {read_value(), left}
"""
)

# A removal owed through an outage, sent late, as of when it was asked
# (server seconds): a lease won by then is dropped (its holder stores
# nothing, having maybe read what was removed), one won since stays.
_OWED = """
local function drop_lease_won_by(as_of)
  local token, _, won_ms = lease_record(redis.call('GET', KEYS[2]))
  if token and won_ms <= as_of * 1000 then
    redis.call('DEL', KEYS[2])
    return true
  end
  return false
end
"""

# An unconditional write (``set``, ``delete``): cancels any rebuild in flight
# by dropping its lease (the record its commit needs), so a rebuild that
# started from older data cannot store over this write, nor after it.
# ARGV: envelope ('' = delete), expire_ms, channel, as_of (a delete's,
# optional: see _OWED). -> 1 written; for a delete, whether there was a
# value to delete.
WRITE = (
    _SET_VALUE
    + _UNFILLED
    + _OWED
    + """
if ARGV[1] == '' and (ARGV[4] or '') ~= '' then
  -- What was written since it was asked stays.
  local as_of = tonumber(ARGV[4])
  if drop_lease_won_by(as_of) then redis.call('PUBLISH', ARGV[3], '2') end
  if written_after(head_of_value(), as_of) then return 0 end
  return redis.call('DEL', KEYS[1])
end
redis.call('DEL', KEYS[2])
if ARGV[1] == '' then
  local deleted = redis.call('DEL', KEYS[1])
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
# invalidated. ARGV: as_of (server seconds, optional: see _OWED; what was
# written since stays fresh). -> 1 marked, 0 absent.
INVALIDATE = (
    _SET_VALUE
    + _UNFILLED
    + _OWED
    + """
local as_of = tonumber(ARGV[1] or '')
if as_of then
  drop_lease_won_by(as_of)
else
  redis.call('DEL', KEYS[2])
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

# A state key holds "<current>:<deleted>:<bumped at>:<made at>", and the
# namespace's one more field, ":<a tag last deleted at>" (times in server
# microseconds, versions in server milliseconds). A state made where none
# was found knows nothing of what came before it: every version recorded
# before is below its deleted version (those entries read as missing), and
# what is recorded from then on is current.
_STATE = """
local function parse_state(v)
  if type(v) ~= 'string' then return nil end
  local c, d, b, made, hard = string.match(v, '^(%d+):(%d+):(%d+):?(%d*):?(%d*)$')
  if not c then return nil end
  return tonumber(c), tonumber(d), tonumber(b), tonumber(made) or 0, tonumber(hard) or 0
end
local function made_state(namespace)
  local now = now_us()
  local ms = math.floor(now / 1000)
  local state = text(ms) .. ':' .. text(ms - 1) .. ':0:' .. text(now)
  -- Whether a tag was deleted before, the namespace cannot tell: as if now.
  if namespace then state = state .. ':' .. text(now) end
  return state
end
"""

# What a rebuild records of a tag before it reads its data: the tag's state,
# made if missing (or foreign), and kept at least keep_ms more ('0':
# forever), to outlive the entry. KEYS[1]: the tag's state key. ARGV:
# keep_ms, namespace ('1': the namespace's state, which never expires).
CAPTURE = (
    _NOW_MS
    + _STATE
    + """
local v = redis.pcall('GET', KEYS[1])
if not parse_state(v) then
  v = made_state(ARGV[2] == '1')
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
# of the bump is kept beside them, for the leases won before it. 'noted': the
# namespace's state only notes that a tag is being deleted now (see
# ``versions_for``). A tag whose state is missing is left so (its entries
# read as missing already, and a lease committed with it later makes it
# knowing nothing of before); the namespace's is made. KEYS[1]: the state
# key. ARGV: soft, hard or noted; namespace ('1'). -> the new state (nil: none).
BUMP = (
    _NOW_MS
    + _STATE
    + """
local namespace = ARGV[2] == '1'
local current, deleted, bumped, made, hard = parse_state(redis.pcall('GET', KEYS[1]))
if not current then
  if not namespace then return false end
  local state = made_state(true)
  redis.call('SET', KEYS[1], state)
  if ARGV[1] == 'noted' then return state end
  current, deleted, bumped, made, hard = parse_state(state)
end
local now = now_us()
if ARGV[1] == 'noted' then
  hard = now
else
  current = math.max(current + 1, math.floor(now / 1000))
  if ARGV[1] == 'hard' then deleted = current end
  bumped = now
end
local state = text(current) .. ':' .. text(deleted) .. ':' .. text(bumped) .. ':' .. text(made)
if namespace then state = state .. ':' .. text(hard) end
redis.call('SET', KEYS[1], state, 'KEEPTTL')
return state
"""
)


def sharded(script: str) -> str:
    """``script`` publishing with ``SPUBLISH`` (sharded pub/sub: Redis 7+,
    Valkey) instead of ``PUBLISH``; its channel shares its keys' hash tag."""
    return script.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")
