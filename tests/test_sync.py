"""What only the blocking driver can get wrong."""

from __future__ import annotations

import time

import redis

import stampede
from stampede.testing import RedisServer
from tests.helpers import run_threads, traceback_depth, wait_until


def test_a_shared_error_keeps_the_leaders_traceback(sf: stampede.Stampede) -> None:
    def failing() -> None:
        time.sleep(0.2)
        raise RuntimeError("down")

    results = run_threads(30, lambda: sf.get_or_rebuild("k", failing, ttl=60))
    errors = {id(result): result for result in results}
    assert len(errors) == 1  # the same object for every caller of the process
    (error,) = errors.values()
    assert isinstance(error, RuntimeError)
    assert traceback_depth(error) < 15  # not one more stack per caller that re-raised it


def test_context_manager_closes_what_from_url_opened(server: RedisServer) -> None:
    with redis.Redis.from_url(server.url) as admin:
        before = admin.info("clients")["connected_clients"]
        with stampede.Stampede.from_url(server.url) as sf:
            sf.set("k", 1, ttl=5)
            assert admin.info("clients")["connected_clients"] == before + 1
        wait_until(lambda: admin.info("clients")["connected_clients"] == before)
