"""stampede: exactly one rebuild per expired cache key, across every process.

>>> import redis, stampede
>>> sf = stampede.Stampede(redis.Redis(socket_timeout=5))
>>> sf.get_or_rebuild("user:42", load_user, ttl=60, stale_ttl=600)

The asyncio twin is :class:`stampede.asyncio.Stampede`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._core.cached import CachedFunction as CachedFunction
from ._core.cached import function_key as function_key
from ._core.envelope import Entry as Entry
from ._core.events import Event as Event
from ._core.events import EventHook as EventHook
from ._core.events import EventKind as EventKind
from ._core.events import hook_from as hook_from
from ._core.lease import Lease as Lease
from ._core.lease import Read as Read
from ._core.near import NearCache as NearCache
from ._core.options import Options as Options
from ._core.scope import LeaseScope as LeaseScope
from ._core.serializers import Compressed as Compressed
from ._core.serializers import JsonSerializer as JsonSerializer
from ._core.serializers import PickleSerializer as PickleSerializer
from ._core.serializers import Serializer as Serializer
from ._core.serializers import serializer_from as serializer_from
from ._core.signing import Signer as Signer
from ._core.signing import signer_from as signer_from
from ._core.unstored import Unstored as Unstored
from ._default import configure as configure
from ._default import default as default
from ._default import get_or_rebuild as get_or_rebuild
from ._exceptions import ConfigurationError as ConfigurationError
from ._exceptions import KeyTypeError as KeyTypeError
from ._exceptions import RebuildFailedError as RebuildFailedError
from ._exceptions import RedisUnavailableError as RedisUnavailableError
from ._exceptions import SerializationError as SerializationError
from ._exceptions import StampedeError as StampedeError
from ._exceptions import UnknownOptionError as UnknownOptionError
from ._exceptions import WaitTimeoutError as WaitTimeoutError
from ._protocol.urls import check_connection_options as check_connection_options
from ._protocol.urls import redact as redact_url
from ._protocol.urls import redis_url_kind as redis_url_kind
from ._sync.stampede import Stampede as Stampede
from ._sync.stampede import redis_client as redis_client

__version__ = "0.1.0"

if TYPE_CHECKING:
    from . import asyncio as asyncio
    from . import testing as testing
else:
    #: Submodules reachable as attributes after ``import stampede`` alone.
    _LAZY = frozenset({"asyncio", "testing"})

    def __getattr__(name: str) -> object:
        """``stampede.testing`` and ``stampede.asyncio`` without importing them
        first (PEP 562): imported at their first use, which makes them attributes.
        Hidden from type checkers, which would take any name for an attribute."""
        if name in _LAZY:
            import importlib

            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


del TYPE_CHECKING  # not a public name

__all__ = [
    "CachedFunction",
    "Compressed",
    "ConfigurationError",
    "Entry",
    "Event",
    "EventHook",
    "EventKind",
    "JsonSerializer",
    "KeyTypeError",
    "Lease",
    "LeaseScope",
    "NearCache",
    "Options",
    "PickleSerializer",
    "Read",
    "RebuildFailedError",
    "RedisUnavailableError",
    "SerializationError",
    "Serializer",
    "Signer",
    "Stampede",
    "StampedeError",
    "UnknownOptionError",
    "Unstored",
    "WaitTimeoutError",
    "check_connection_options",
    "configure",
    "default",
    "function_key",
    "get_or_rebuild",
    "hook_from",
    "redact_url",
    "redis_client",
    "redis_url_kind",
    "serializer_from",
    "signer_from",
]
