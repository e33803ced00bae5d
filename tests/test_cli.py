"""``python -m stampede`` (``stampede.cli``) against a real redis-server: what it
shows of an entry, its tags and its lease, what it counts, what it invalidates."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from typing import Any

import pytest
import redis

import stampede
from stampede._protocol.messages import holder
from stampede.cli import main


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(argv), out=out)
    return status, out.getvalue()


def inspected(url: str, namespace: str, *keys: str) -> list[dict[str, Any]]:
    status, out = run("--url", url, "--namespace", namespace, "--json", "inspect", *keys)
    assert status == 0
    reports: list[dict[str, Any]] = json.loads(out)
    return reports


@pytest.fixture
def sf(redis_url: str, namespace: str) -> Any:
    made = stampede.Stampede.from_url(redis_url, namespace=namespace, lease_ttl=30, signing_key=b"k" * 32)
    yield made
    made.close()


def test_inspect_shows_a_tagged_stale_leased_entry_whole(sf: Any, redis_url: str, namespace: str) -> None:
    def rebuild() -> dict[str, str]:
        time.sleep(0.05)
        return {"name": "Ada"}

    sf.get_or_rebuild("user:42", rebuild, ttl=600, stale_ttl=600, tags=["users", "org:1"])
    written = time.time()
    sf.invalidate_tags("users")
    refreshing = sf.read("user:42", ttl=600, stale_ttl=600)  # stale: this caller takes the lease
    assert refreshing.lease is not None
    (report,) = inspected(redis_url, namespace, "user:42")
    assert report["key"] == "user:42"
    assert (report["status"], report["because"]) == ("stale", "invalidated by tag 'users'")
    assert report["bytes"] == len(sf.client.get(sf._keys("user:42").value))
    assert report["format"] == "pickle"
    assert report["signed"] is True
    assert report["compressed"] is False
    assert report["marked_stale"] is False
    assert report["rebuild_seconds"] >= 0.04  # the rebuild's own time, as stored
    assert abs(report["created_at"] - written) < 5
    assert report["fresh_until"] == pytest.approx(report["created_at"] + 600, abs=1)
    assert 0 <= report["age"] < 60
    assert report["namespace"]["since"] == "current"
    assert [(tag["name"], tag["since"]) for tag in report["tags"]] == [
        ("users", "invalidated"),
        ("org:1", "current"),
    ]
    lease = report["lease"]
    assert lease["state"] == "held"
    assert lease["holder"] == holder()
    assert 0 < lease["remaining"] <= 30
    sf.release(refreshing.lease)


def test_inspect_says_why_an_entry_is_missing_and_what_its_lease_holds(
    sf: Any, redis_url: str, namespace: str
) -> None:
    sf.set("gone", "v", ttl=600, tags=["t"])
    sf.delete_tags("t")
    sf.set("marked", "v", ttl=600)
    sf.invalidate("marked")

    def fails() -> str:
        raise ValueError("the database is down")

    with pytest.raises(ValueError, match="database is down"):
        sf.get_or_rebuild("failing", fails)
    sf.client.set(sf._keys("foreign").value, b"not ours")
    gone, marked, failing, foreign, never = inspected(
        redis_url, namespace, "gone", "marked", "failing", "foreign", "never"
    )
    assert (gone["status"], gone["because"]) == ("missing", "deleted by tag 't'")
    assert (marked["status"], marked["because"]) == ("stale", "marked stale (invalidate)")
    assert marked["marked_stale"] is True
    assert failing["status"] == "missing"
    assert failing["lease"]["state"] == "failed"
    assert failing["lease"]["failures"] == 1
    assert "the database is down" in failing["lease"]["error"]
    assert failing["lease"]["remaining"] > 0
    assert (foreign["status"], foreign["bytes"]) == ("foreign", 8)
    assert (never["status"], never["lease"]["state"]) == ("missing", "free")


def test_inspect_reads_a_lost_tag_state_as_what_a_read_makes_of_it(
    sf: Any, client: redis.Redis, redis_url: str, namespace: str
) -> None:
    sf.set("k", "v", ttl=600, tags=["evicted"])
    client.delete(sf._settings.tags.key(b"evicted"))  # as an eviction would
    (report,) = inspected(redis_url, namespace, "k")
    assert report["status"] == "missing"
    assert "'evicted'" in report["because"]
    assert report["tags"][0]["since"] == "lost"


def test_the_text_output_names_every_field(sf: Any, redis_url: str, namespace: str) -> None:
    sf.set("k", "v", ttl=600, tags=["a"])
    held = sf.read("other")
    status, out = run("--url", redis_url, "--namespace", namespace, "inspect", "k", "other")
    assert status == 0
    first, second = out.split("\nother: ")
    assert first.startswith("k: fresh")
    for label in ("fresh until", "written", "last rebuild", "stored", "tags", "lease"):
        assert f"  {label}" in first
    assert "'a' current" in first
    assert second.startswith("missing")
    assert f"held by {holder()}" in second
    sf.release(held.lease)


def test_tag_commands_invalidate_and_delete_as_the_api_does(sf: Any, redis_url: str, namespace: str) -> None:
    sf.set("a", 1, ttl=600, tags=["x"])
    sf.set("b", 2, ttl=600, tags=["y"])
    sf.set("c", 3, ttl=600)
    base = ("--url", redis_url, "--namespace", namespace)
    assert run(*base, "invalidate-tags", "x")[0] == 0
    assert run(*base, "delete-tags", "y")[0] == 0
    a, b, c = inspected(redis_url, namespace, "a", "b", "c")
    assert (a["status"], b["status"], c["status"]) == ("stale", "missing", "fresh")
    assert run(*base, "invalidate-all")[0] == 0
    (c,) = inspected(redis_url, namespace, "c")
    assert (c["status"], c["because"]) == ("stale", "invalidated by invalidate_all")


def test_stats_counts_entries_bytes_leases_and_tag_states_by_scan(
    sf: Any, redis_url: str, namespace: str
) -> None:
    for n in range(25):
        sf.set(f"k{n}", "v" * n, ttl=600, tags=[f"t{n % 3}"])
    held = sf.read("being-rebuilt")
    sf.client.set(sf._keys("foreign").value, b"x")
    status, out = run("--url", redis_url, "--namespace", namespace, "--json", "stats", "--count", "7")
    assert status == 0
    found = json.loads(out)
    values = [sf._keys(f"k{n}").value for n in range(25)]
    assert found["entries"] == 25
    assert found["entry_bytes"] == sum(sf.client.strlen(name) for name in values)
    assert found["leases_held"] == 1
    assert found["tag_states"] == 3
    assert found["namespace_state"] == 1
    assert found["foreign"] == 1
    sf.release(held.lease)


def test_an_unreachable_redis_or_bad_arguments_fail_with_a_clear_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _ = run("--url", "redis://127.0.0.1:1/0", "inspect", "k")
    assert status == 1
    assert "127.0.0.1:1" in capsys.readouterr().err
    assert run("--url", "http://example.com", "inspect", "k")[0] == 2
    assert "http" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        run("inspect")  # no key
    assert exit_.value.code == 2


def test_python_m_stampede_is_the_command(redis_url: str, namespace: str) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "stampede", "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    for command in ("inspect", "invalidate-tags", "delete-tags", "invalidate-all", "stats"):
        assert command in shown.stdout
    ran = subprocess.run(
        [sys.executable, "-m", "stampede", "--url", redis_url, "--namespace", namespace, "inspect", "k"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("k: missing (no value)")


@pytest.mark.slow
def test_on_a_cluster_inspect_reads_each_key_where_it_lives_and_stats_scans_every_primary(
    cluster: Any, namespace: str
) -> None:
    with stampede.Stampede.from_url(cluster.url, namespace=namespace) as sf:
        for n in range(30):  # spread over the three primaries' slots
            sf.set(f"k{n}", n, ttl=600, tags=[f"t{n % 4}"])
        sf.invalidate_tags("t1")
        base = ("--url", cluster.url, "--namespace", namespace, "--json")
        status, out = run(*base, "stats")
        assert status == 0
        found = json.loads(out)
        assert (found["entries"], found["tag_states"], found["namespace_state"]) == (30, 4, 1)
        status, out = run(*base, "inspect", "k1", "k2")
        assert status == 0
        k1, k2 = json.loads(out)
        assert (k1["status"], k1["because"]) == ("stale", "invalidated by tag 't1'")
        assert (k2["status"], k2["format"]) == ("fresh", "int")
