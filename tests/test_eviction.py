"""A Redis that evicts: under every ``maxmemory-policy``, with Redis evicting values, leases and
tag states while instances read, rebuild, write, invalidate and delete, no read serves as fresh
a value that was invalidated, deleted or replaced before it began, and none serves at all what
``delete`` or ``delete_tags`` removed (``bench.faults._evicting`` checks each read against the
versions of a database). Counts, never durations.
"""

from __future__ import annotations

import time

import pytest
import redis

import stampede
from bench.faults import _evicting

pytestmark = pytest.mark.slow

#: Short runs, each on a fresh server: a few seconds of churn evict thousands of keys.
SCENARIO = _evicting.Scenario(seconds=3.0)


@pytest.mark.parametrize("policy", _evicting.POLICIES)
def test_no_read_travels_back_in_time_while_redis_evicts(policy: str) -> None:
    outcome = _evicting.run(SCENARIO, policy)
    assert outcome.violations == 0, outcome.describe()
    # Reads never fail for what Redis evicts or, full, refuses.
    assert not {kind: n for kind, n in outcome.errors.items() if ":" not in kind}, outcome.describe()
    assert outcome.reads > 300, outcome.describe()
    assert sum(outcome.writes.values()) > 50, outcome.describe()
    if policy != "noeviction":
        # It did evict, and not only the filler's keys.
        assert outcome.evicted["value"] > 0, outcome.describe()


#: Keys written in all, and the most that may be left once every one of them has lived its life.
WRITTEN = 20_000
LEFT_AT_MOST = 10


def test_short_lived_keys_leave_nothing_behind(redis_url: str, namespace: str) -> None:
    # 20,000 keys living 1 s (and 1 s stale), through every way of writing one, each with a tag
    # of its own (per-object tags) and with a delete or an invalidation of every fourth one;
    # once their lives and a lease's time have passed, what is left of them all is the
    # namespace's state. (Fences and tags' states used to stay 300 s each.)
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    sf = stampede.Stampede(client, namespace=namespace, ttl=1, stale_ttl=1, lease_ttl=1)
    try:
        batch = 200
        for start in range(0, WRITTEN, batch):
            names = [f"k{n}" for n in range(start, start + batch)]
            way = (start // batch) % 5
            for n, key in enumerate(names):
                tag = [f"object:{start + n}"]
                if way == 0:
                    sf.get_or_rebuild(key, lambda key=key: key, tags=tag)
                elif way == 1:
                    sf.set(key, key, tags=tag)
                elif way == 2:
                    read = sf.read(key, tags=tag)
                    assert read.lease is not None
                    sf.commit(read.lease, key, tags=[*tag, "and:another"])
                elif way == 3:
                    sf.add(key, 1)
                    sf.incr(key)
                    sf.touch(key, ttl=1)
                else:
                    continue
                if n % 4 == 0:
                    sf.invalidate(key) if n % 8 == 0 else sf.delete(key)
            if way == 4:
                sf.get_or_rebuild_many(names, lambda keys: {key: key for key in keys}, tags=["batch"])
                sf.set_many({key: key for key in names[: batch // 2]})
                sf.invalidate_tags(f"object:{start}", "never-used")
                sf.delete_tags(f"object:{start + 1}", "never-used-either")
        time.sleep(1 + 1 + 1 + 0.5)  # ttl + stale_ttl + lease_ttl, and a moment
        # SCAN leaves out keys past their expiry (DBSIZE counts those Redis has not reclaimed yet).
        left = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        assert len(left) <= LEFT_AT_MOST, sorted(left)[:20]
    finally:
        sf.close()
        client.close()
