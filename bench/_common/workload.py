"""What the benchmarks cache: the value, the key names, the stampede namespace; and the clean-up of
a run's keys on a Redis that is not a throwaway one."""

from __future__ import annotations

from typing import Any

__all__ = ["NAMESPACE", "REBUILD_SECONDS", "delete_matching", "key_prefix", "make_value"]

#: The stampede namespace of every key the benchmark writes through stampede.
NAMESPACE = "stampede-bench"

#: How long the simulated expensive rebuild (a slow query) takes.
REBUILD_SECONDS = 0.2


def key_prefix(run_id: str) -> str:
    """The prefix of every key one benchmark run uses, so a shared Redis can be cleaned up."""
    return f"bench:{run_id}:"


def make_value() -> dict[str, Any]:
    """A small record of ten fields, like a user row a web request would cache."""
    return {
        "id": 42,
        "username": "ada",
        "email": "ada@example.com",
        "full_name": "Ada Lovelace",
        "is_active": True,
        "is_staff": False,
        "score": 97.5,
        "groups": ["admins", "analysts"],
        "date_joined": "2015-12-10T09:30:00+00:00",
        "last_login": "2025-11-20T17:04:11+00:00",
    }


def delete_matching(client: Any, pattern: str) -> None:
    """Remove the keys that match ``pattern`` (``SCAN``'s ``MATCH``) from ``client``'s Redis (a
    ``redis.Redis``), a thousand at a time."""
    keys = list(client.scan_iter(match=pattern, count=1000))
    for start in range(0, len(keys), 1000):
        client.unlink(*keys[start : start + 1000])
