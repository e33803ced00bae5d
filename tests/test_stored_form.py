"""What an entry costs in Redis, and that the compact form keeps every promise.

An entry is its serialized value plus a 16-byte header and its tag block (11
bytes without tags: its namespace's version), plus a 16-byte signature when
signed: these tests hold the stored bytes to that, so a
change that makes every entry bigger fails here, not in a benchmark no one
ran. And the compact fields (milliseconds, a float16, flags) still do their
jobs: ints count, `invalidate` and `touch` work in place, compressed values
read back, a compression bomb is a miss, and values of the earlier format
are a miss once.
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import zlib
from typing import Any

import pytest
import redis

import stampede
from stampede import ConfigurationError, PickleSerializer
from stampede._core import envelope
from stampede._core.envelope import (
    COMPRESSED,
    HEADER_SIZE,
    KIND,
    MAC_SIZE,
    NAMESPACE_BLOCK_SIZE,
    SIGNED,
    STALE,
    TAGGED,
    header,
)
from stampede._core.keys import KeySpace

KEY = b"signing-key-for-tests-0123456789"
SMALL_DICT = {"id": 1234, "name": "user1234", "active": True}
PAGE = "".join(f"<li><a href='/post/{n}'>Post number {n}</a></li>" for n in range(60))


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize(
    "value", ["x" * 100, SMALL_DICT, [1.5, None, "text"]], ids=["str100", "dict", "list"]
)
def test_an_entry_is_its_pickle_a_header_and_a_signature(
    make_driver: Any, client: redis.Redis, keys: KeySpace, signed: bool, value: Any
) -> None:
    sf = make_driver(signing_key=KEY if signed else None)
    sf.set("k", value, ttl=60)
    stored = client.get(keys("k").value)
    overhead = HEADER_SIZE + NAMESPACE_BLOCK_SIZE + (MAC_SIZE if signed else 0)
    assert len(stored) == overhead + len(PickleSerializer().dumps(value))
    # Smaller than the whole pickle a stock cache stores, for an unsigned value.
    assert len(stored) - overhead < len(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    assert sf.get("k").value == value


def test_a_key_is_stored_under_its_namespace_and_its_name(client: redis.Redis, namespace: str) -> None:
    sf = stampede.Stampede(client, namespace=namespace)
    sf.set("user:1234", 1, ttl=60)
    assert client.exists(f"{namespace}:{{user:1234")
    assert sf._keys("user:1234").lease == f"{namespace}:{{{namespace}:{{user:1234}}:lease".encode()
    sf.close()


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("number", [0, 1, -1, 127, 128, -128, -129, 123456, 2**63 - 2, -(2**63)])
def test_ints_round_trip_and_count(
    make_driver: Any, client: redis.Redis, keys: KeySpace, signed: bool, number: int
) -> None:
    sf = make_driver(signing_key=KEY if signed else None)
    sf.set("n", number, ttl=60)
    assert sf.get("n").value == number
    assert sf.incr("n", 1) == number + 1
    assert sf.get("n").value == number + 1
    stored = client.get(keys("n").value)
    payload = stored[HEADER_SIZE + NAMESPACE_BLOCK_SIZE : len(stored) - (MAC_SIZE if signed else 0)]
    if signed:  # binary: as short as it goes
        assert payload == (number + 1).to_bytes(len(payload), "little", signed=True)
        assert len(payload) <= max(1, ((number + 1).bit_length() + 8) // 8)
    else:  # decimal, which the INCR script changes in place
        assert payload == str(number + 1).encode()


def test_a_signed_int_costs_less_than_its_digits(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver(signing_key=KEY)
    sf.set("n", 123456, ttl=60)
    assert len(client.get(keys("n").value)) == HEADER_SIZE + NAMESPACE_BLOCK_SIZE + 3 + MAC_SIZE


def test_times_keep_a_millisecond(make_driver: Any) -> None:
    sf = make_driver()
    sf.set("k", "v", ttl=30.25)
    entry = sf.get("k")
    assert entry.fresh_until - entry.created_at == pytest.approx(30.25, abs=0.05)
    sf.set("forever", "v", ttl=None)
    assert sf.get("forever").fresh_until == float("inf")


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_invalidate_sets_the_stale_flag_and_touch_clears_it(
    make_driver: Any, client: redis.Redis, keys: KeySpace, signed: bool
) -> None:
    sf = make_driver(signing_key=KEY if signed else None)
    sf.set("k", SMALL_DICT, ttl=60, stale_ttl=600)
    assert sf.invalidate("k") is True
    assert client.get(keys("k").value)[0] & STALE
    assert sf.invalidate("k") is True  # twice: still stale, still verifies
    assert sf.get("k").value == SMALL_DICT
    assert not sf.get("k").is_fresh()
    assert sf.touch("k", ttl=60) is True
    assert not client.get(keys("k").value)[0] & STALE
    assert sf.get("k").is_fresh()
    assert sf.get("k").value == SMALL_DICT


def test_large_values_are_compressed_where_it_pays(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver()
    sf.set("page", PAGE, ttl=60)
    stored = client.get(keys("page").value)
    assert stored[0] & COMPRESSED
    assert len(stored) < len(PAGE) // 3
    assert sf.get("page").value == PAGE
    noise = os.urandom(4000)  # does not shrink: stored as it is
    sf.set("noise", noise, ttl=60)
    assert not client.get(keys("noise").value)[0] & COMPRESSED
    sf.set("short", "y" * 500, ttl=60)  # under compress_above
    assert not client.get(keys("short").value)[0] & COMPRESSED
    assert sf.get("noise").value == noise


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_compression_is_the_writers_choice_and_every_reader_inflates(
    make_driver: Any, client: redis.Redis, keys: KeySpace, signed: bool
) -> None:
    key = KEY if signed else None
    writer = make_driver(signing_key=key, compress_above=100)
    never = make_driver(signing_key=key, compress_above=None)
    writer.set("a", "z" * 300, ttl=60)
    never.set("b", "z" * 300000, ttl=60)
    assert client.get(keys("a").value)[0] & COMPRESSED
    assert not client.get(keys("b").value)[0] & COMPRESSED
    assert never.get("a").value == "z" * 300
    assert writer.get("b").value == "z" * 300000


def test_a_compression_bomb_is_a_miss(
    make_driver: Any, client: redis.Redis, keys: KeySpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A payload that inflates past the bound (lowered here from 512 MiB, so the
    # test need not build one that large) is refused before it is unpickled.
    monkeypatch.setattr(envelope, "MAX_INFLATED", 1024 * 1024)
    sf = make_driver()
    bomb = pickle.dumps(b" " * 5_000_000)
    data = header(KIND | COMPRESSED, PickleSerializer.codec_id, fresh_until=9e9, created_at=0, duration=0)
    client.set(keys("k").value, data + zlib.compress(bomb))
    assert sf.get("k") is None
    assert sf.get_or_rebuild("k", lambda: "rebuilt", ttl=60) == "rebuilt"


def test_a_value_in_the_earlier_format_is_a_miss_said_as_such(
    make_driver: Any, client: redis.Redis, keys: KeySpace, caplog: pytest.LogCaptureFixture
) -> None:
    sf = make_driver()
    old = b"\xa7S\x01\x01" + struct.pack("<ddf", 9e9, 0, 0) + pickle.dumps("old")
    client.set(keys("k").value, old)
    with caplog.at_level(logging.WARNING, logger="stampede"):
        assert sf.get_or_rebuild("k", lambda: "new", ttl=60) == "new"
    assert "earlier stampede format" in caplog.text
    assert client.get(keys("k").value)[0] & 0xF0 == KIND  # stored in this one


def test_incr_refuses_what_it_cannot_change_in_place(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver()
    signed = make_driver(signing_key=KEY)
    signed.set("signed", 5, ttl=60)
    with pytest.raises(TypeError, match="not an integer"):
        sf.incr("signed")  # a signed int: only a signing instance may change it
    sf.set("text", "5", ttl=60)
    with pytest.raises(TypeError, match="not an integer"):
        sf.incr("text")
    sf.set("tagged", 5, ttl=60, tags=["t"])
    assert client.get(keys("tagged").value)[0] & TAGGED
    assert sf.incr("tagged", 2) == 7
    assert signed.incr("signed", 2) == 7
    assert client.get(keys("signed").value)[0] & SIGNED


@pytest.mark.parametrize(
    "value",
    [None, True, 1.5, "é" * 10, b"\x00" * 70_000, list(range(30_000)), {"nested": [{"a": {1, 2}}]}],
    ids=["none", "bool", "float", "str", "bytes", "long list", "nested"],
)
@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_pickles_without_their_opening_opcodes_read_back(value: Any, protocol: int) -> None:
    serializer = PickleSerializer(protocol)
    data = serializer.dumps(value)
    assert len(data) <= len(pickle.dumps(value, protocol))
    assert serializer.loads(data) == value
    assert serializer.loads(pickle.dumps(value, protocol)) == value  # a whole pickle reads too


def test_shared_references_stay_shared() -> None:
    shared = [1, 2]
    value = PickleSerializer().loads(PickleSerializer().dumps({"a": shared, "b": shared}))
    assert value["a"] is value["b"]


@pytest.mark.parametrize("setting", [-1, 1.5, "1024", True])
def test_a_bad_compress_above_names_the_argument(client: redis.Redis, setting: Any) -> None:
    with pytest.raises(ConfigurationError, match="compress_above must be a number of bytes"):
        stampede.Stampede(client, compress_above=setting)
