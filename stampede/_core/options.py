"""The frozen, validated options object shared by every driver."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, TypeVar

from .._exceptions import ConfigurationError, UnknownOptionError

__all__ = ["CALL_OPTIONS", "UNSET", "NoMore", "Options", "WaitTimeoutPolicy", "unknown_arguments"]

WaitTimeoutPolicy = Literal["rebuild", "raise"]

#: The options a single ``get_or_rebuild`` call may override.
CALL_OPTIONS = frozenset(
    {"ttl", "stale_ttl", "stale_if_error", "lease_ttl", "wait_timeout", "background", "beta"}
)


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


#: Marks a per-call option the caller left at the instance's default.
UNSET: Any = _Unset()


#: The longest time an option may name: about 68 years. Redis refuses
#: expiries much beyond it, and Python's waits raise OverflowError.
MAX_SECONDS = float(2**31)


def _number(name: str, value: object) -> float:
    # bool is an int subclass; ttl=True is a bug, not one second.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(
            f"{name} must be a number of seconds, got {type(value).__name__} {value!r}", field=name
        )
    number = float(value)
    if not math.isfinite(number):
        raise ConfigurationError(f"{name} must be finite, got {value!r}", field=name)
    if number > MAX_SECONDS:
        raise ConfigurationError(
            f"{name} must be at most {MAX_SECONDS:.0f} seconds (68 years), got {value!r}", field=name
        )
    return number


def _positive(name: str, value: object) -> float:
    number = _number(name, value)
    if number <= 0:
        raise ConfigurationError(f"{name} must be greater than 0, got {value!r}", field=name)
    return number


def _non_negative(name: str, value: object) -> float:
    number = _number(name, value)
    if number < 0:
        raise ConfigurationError(f"{name} must be 0 or more, got {value!r}", field=name)
    return number


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}", field=name)
    return value


def _unknown(
    what: str, kind: str, unknown: Iterable[str], known: Sequence[str], instance_only: Iterable[str] = ()
) -> UnknownOptionError:
    """The error for ``what`` (``"get_or_rebuild()"``...) given ``unknown``
    keywords, which are ``kind`` (``"keyword argument"``, ``"option"``): it
    names them (its ``field``: the first), suggests the close match among
    ``known`` (or, for a name of ``instance_only``, where it goes instead),
    and lists ``known``."""
    names = sorted(unknown)
    hints = []
    for name in names:
        if name in instance_only:
            hints.append(
                f"{name} is an option of the instance, not of a call: give it to Stampede() or Options()."
            )
        elif close := difflib.get_close_matches(name, known, n=1):
            hints.append(
                f"did you mean {close[0]}?" if len(names) == 1 else f"{name}: did you mean {close[0]}?"
            )
    head = (
        f"an unknown {kind} {names[0]!r}"
        if len(names) == 1
        else f"unknown {kind}s {', '.join(map(repr, names))}"
    )
    listed = ", ".join(known[:-1]) + f" and {known[-1]}" if len(known) > 1 else "".join(known)
    takes = "The options are" if kind == "option" else f"The {kind}s it takes are"
    message = f"{what} got {head}: " + "".join(f"{hint} " for hint in hints) + f"{takes} {listed}."
    return UnknownOptionError(message, field=names[0])


def unknown_arguments(function: Callable[..., Any], unknown: Iterable[str]) -> UnknownOptionError:
    """The error for a call of ``function`` (a method taking ``**unknown``)
    with keyword arguments it does not take."""
    code = getattr(function, "__func__", function).__code__
    keywords = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    fields = {field.name for field in dataclasses.fields(Options)}
    return _unknown(f"{function.__name__}()", "keyword argument", unknown, keywords, fields - set(keywords))


class NoMore(TypedDict):
    """No keyword argument: what the ``**unknown`` of a method that takes options
    is typed with, so that a type checker refuses any keyword it does not name
    (at run time, the method raises :class:`UnknownOptionError` naming it)."""


_C = TypeVar("_C", bound=type)


def _naming_unknown_options(cls: _C) -> _C:
    """Make ``cls`` (a dataclass) refuse an unknown keyword with an
    :class:`UnknownOptionError` that names it and lists its fields (its
    generated ``__init__`` raises a bare ``TypeError``)."""
    init = vars(cls)["__init__"]  # the one dataclass() generated
    fields = tuple(field.name for field in dataclasses.fields(cls))
    known = frozenset(fields)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not kwargs.keys() <= known:
            raise _unknown(f"{cls.__name__}()", "option", kwargs.keys() - known, fields)
        init(self, *args, **kwargs)

    __init__.__wrapped__ = init  # type: ignore[attr-defined]  # inspect.signature() shows the fields
    __init__.__qualname__ = init.__qualname__
    __init__.__doc__ = init.__doc__
    type.__setattr__(cls, "__init__", __init__)
    return cls


@_naming_unknown_options
@dataclass(frozen=True, slots=True)
class Options:
    """How stampede caches, leases and waits; validated when built.

    Attributes:
        ttl: seconds a value stays fresh; ``None`` keeps it fresh forever.
        stale_ttl: seconds after ``ttl`` during which the old value is still
            served while exactly one caller refreshes it. Redis expires the
            key after ``ttl + stale_ttl`` (``+ stale_if_error``): the hard
            bound on staleness.
        stale_if_error: seconds after ``ttl + stale_ttl`` during which the
            old value is kept to be served only when it cannot be replaced
            (RFC 5861 ``stale-if-error``): its rebuild raised, or is in its
            back-off after raising, or Redis failed. Otherwise it is a miss:
            one caller rebuilds, the others wait for its value. ``0``: none.
        lease_ttl: seconds a rebuild lease lives in Redis without renewal.
            A watchdog renews it while the rebuild runs, so this only bounds
            how long a crashed holder blocks others.
        max_lease_time: seconds after which the watchdog stops renewing a
            lease, letting another caller take over a rebuild that hangs.
        wait_timeout: seconds a caller waits for another caller's rebuild of
            a missing key before ``on_wait_timeout`` applies.
        on_wait_timeout: ``"rebuild"`` rebuilds for the waiting caller
            without the lease and does not store the result (nothing would
            fence that write); ``"raise"`` raises
            :class:`~stampede.WaitTimeoutError`.
        background: refresh stale values in the background, so that even
            the caller that wins the lease is served the stale value at once.
        beta: enables probabilistic early refresh (XFetch) with this
            aggressiveness; ``1.0`` is the usual choice, ``None`` disables it.
        fail_open: when Redis is unreachable, run the rebuild directly
            (still coalesced within the process) instead of raising
            :class:`~stampede.RedisUnavailableError`.
        unfilled_ttl: seconds a missing key is remembered as one that reads
            do not fill, once a lease taken by a read (a Django ``get``, a
            Flask-Caching ``get``: see :class:`~stampede.LeaseScope`) ended
            with its unit of work and no value: reads of it miss at once,
            without a lease and without waiting, until a write of the key or
            this long; ``0``: never remembered.
        max_value_size: the most bytes a value may take once serialized;
            a larger one raises :class:`~stampede.SerializationError` before
            anything is sent (a rebuild's lease is released). ``None``: no
            limit but Redis's own (512 MB by default, less if so configured).
    """

    ttl: float | None = 300.0
    stale_ttl: float = 0.0
    stale_if_error: float = 0.0
    lease_ttl: float = 5.0
    max_lease_time: float = 300.0
    wait_timeout: float = 10.0
    on_wait_timeout: WaitTimeoutPolicy = "rebuild"
    background: bool = False
    beta: float | None = None
    fail_open: bool = False
    unfilled_ttl: float = 60.0
    max_value_size: int | None = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        # Normalise in place (frozen, hence object.__setattr__) so that the
        # rest of the library only ever sees floats and bools.
        set_ = object.__setattr__
        if self.ttl is not None:
            set_(self, "ttl", _positive("ttl", self.ttl))
        set_(self, "stale_ttl", _non_negative("stale_ttl", self.stale_ttl))
        set_(self, "stale_if_error", _non_negative("stale_if_error", self.stale_if_error))
        lease_ttl = _positive("lease_ttl", self.lease_ttl)
        if lease_ttl < 0.01:
            raise ConfigurationError(f"lease_ttl must be at least 0.01, got {lease_ttl!r}", field="lease_ttl")
        set_(self, "lease_ttl", lease_ttl)
        max_lease_time = _positive("max_lease_time", self.max_lease_time)
        if max_lease_time < lease_ttl:
            raise ConfigurationError(
                f"max_lease_time={max_lease_time:g} is below lease_ttl={lease_ttl:g}: max_lease_time "
                "(after which a lease is no longer renewed) must be at least one lease_ttl: raise "
                f"max_lease_time to {lease_ttl:g} or more, or lower lease_ttl",
                field="max_lease_time",
            )
        set_(self, "max_lease_time", max_lease_time)
        set_(self, "wait_timeout", _non_negative("wait_timeout", self.wait_timeout))
        if self.on_wait_timeout not in ("rebuild", "raise"):
            raise ConfigurationError(
                f"on_wait_timeout must be 'rebuild' or 'raise', got {self.on_wait_timeout!r}",
                field="on_wait_timeout",
            )
        _flag("background", self.background)
        _flag("fail_open", self.fail_open)
        set_(self, "unfilled_ttl", _non_negative("unfilled_ttl", self.unfilled_ttl))
        size = self.max_value_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigurationError(
                f"max_value_size must be a number of bytes >= 1 or None, got {size!r}", field="max_value_size"
            )
        if self.beta is not None:
            set_(self, "beta", _positive("beta", self.beta))

    @property
    def lease_ms(self) -> int:
        """The lease TTL in milliseconds, as Redis wants it."""
        return max(1, round(self.lease_ttl * 1000))

    @property
    def unfilled_ms(self) -> int:
        """How long (ms) a key is remembered as one that reads do not fill; ``0``: never."""
        return math.ceil(self.unfilled_ttl * 1000)

    @property
    def expire_ms(self) -> int | None:
        """Milliseconds until Redis drops a value written now; ``None``: never."""
        if self.ttl is None:
            return None
        return max(1, math.ceil((self.ttl + self.stale_ttl + self.stale_if_error) * 1000))

    @property
    def lapse_ms(self) -> int:
        """How late (ms after the lease was won) a lapsed lease's commit may still
        store: how long a lease's record is kept in Redis."""
        return int((self.max_lease_time + self.lease_ttl) * 1000)

    def merged(self, overrides: dict[str, Any]) -> Options:
        """Return these options with per-call ``overrides`` applied (and validated)."""
        if not overrides:
            return self
        unknown = overrides.keys() - CALL_OPTIONS
        if unknown:
            fields = {field.name for field in dataclasses.fields(Options)}
            raise _unknown("a call", "option", unknown, sorted(CALL_OPTIONS), fields - CALL_OPTIONS)
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_mapping(cls, values: dict[str, Any], what: str = "Options.from_mapping()") -> Options:
        """Build options from a mapping, naming any unknown key in the error
        (which says that ``what`` got it)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = values.keys() - fields
        if unknown:
            ordered = [f.name for f in dataclasses.fields(cls)]
            raise _unknown(what, "option", unknown, ordered)
        return cls(**values)
