"""How long waiters and lease keepers sleep between looks at Redis."""

from __future__ import annotations

import random

__all__ = ["RELEASE_GRACE", "renew_interval", "wake_interval"]

#: How long a waiter that found a lease gone without a value gives the
#: release announcement to arrive, to tell a release from an expiry.
RELEASE_GRACE = 0.02


def wake_interval(remaining: float, lease_pttl_ms: int, subscribed: bool) -> float:
    """How long a waiter sleeps before checking Redis itself.

    Waiters are woken by a message when a value lands or a lease is
    released; checking only guards against a holder that died (its lease
    then expires silently) and, while the subscription is not confirmed, a
    message that could have been missed. Jitter keeps waiters apart.
    """
    if not subscribed:
        return max(0.0, min(remaining, random.uniform(0.05, 0.1)))
    until_expiry = lease_pttl_ms / 1000 if lease_pttl_ms > 0 else 0.05
    return max(0.0, min(remaining, until_expiry + random.uniform(0.005, 0.05), 1.0))


def renew_interval(lease_ttl: float) -> float:
    """How often the watchdog renews a lease: three chances before it lapses."""
    return lease_ttl / 3
