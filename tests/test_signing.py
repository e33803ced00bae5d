"""Signed values: what someone else writes into Redis is never deserialized.

A neighbour who can write to the Redis plants values: a pickle that runs code
when loaded, a genuine value copied to another key, an altered payload, a bare
integer. Each must be a miss (a ``corrupt`` event, a warning), never loaded.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any

import pytest
import redis

import stampede
from stampede import ConfigurationError, EventKind, Signer
from stampede._core.envelope import CODEC_AT, FRESH_UNTIL_AT, HEADER_SIZE, INT_CODEC, KIND, header
from stampede._core.keys import KeySpace
from tests.helpers import RAN, Planted, Rebuilds, plant_pickle, run_threads

KEY = b"signing-key-for-tests-0123456789"
OLD_KEY = b"the-previous-signing-key-4567890"


class Recorder:
    def __init__(self) -> None:
        self.kinds: list[EventKind] = []

    def __call__(self, event: stampede.Event) -> None:
        self.kinds.append(event.kind)


def test_a_planted_pickle_is_a_miss_never_loaded(
    make_driver: Any, client: redis.Redis, keys: KeySpace, caplog: pytest.LogCaptureFixture
) -> None:
    events = Recorder()
    sf = make_driver(signing_key=KEY, on_event=events)
    plant_pickle(client, keys("k").value)
    with caplog.at_level(logging.WARNING, logger="stampede"):
        assert sf.get("k") is None
        assert sf.get_many(["k"]) == {}
        assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "v1"
    assert EventKind.CORRUPT in events.kinds
    assert "not signed" in caplog.text
    assert sf.get("k").value == "v1"


def test_without_signing_the_same_plant_runs(make_driver: Any, client: redis.Redis, keys: KeySpace) -> None:
    # What signing prevents: the test above would fail without it.
    sf = make_driver()
    plant_pickle(client, keys("k").value)
    sf.get("k")
    assert RAN == ["planted"]
    RAN.clear()


def test_values_round_trip_signed(make_driver: Any) -> None:
    sf = make_driver(signing_key=KEY)
    assert sf.get_or_rebuild("k", lambda: {"a": [1, 2]}, ttl=60) == {"a": [1, 2]}
    assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == {"a": [1, 2]}
    sf.set_many({"x": "1", "y": b"\x00" * 20_000}, ttl=60)  # a large payload is verified as a view
    assert sf.get_many(["x", "y", "z"]) == {"x": "1", "y": b"\x00" * 20_000}
    assert sf.add("x", "2", ttl=60) is False
    assert sf.add("w", None, ttl=60) is True
    assert sf.get("w").value is None


#: Bits of a signed envelope (see stampede._core.envelope), by offset and mask: each is covered by the tag.
SIGNED_BYTES = {
    "signature": (-3, 0x01),
    "compressed flag": (0, 0x04),
    "codec": (CODEC_AT, 0x01),
    "fresh_until": (FRESH_UNTIL_AT + 1, 0x01),
    "duration": (FRESH_UNTIL_AT + 7, 0x01),
    "payload": (HEADER_SIZE + 1, 0x01),
}


@pytest.mark.parametrize("where", SIGNED_BYTES)
def test_an_altered_value_is_a_miss(
    make_driver: Any, client: redis.Redis, keys: KeySpace, where: str
) -> None:
    sf = make_driver(signing_key=KEY)
    sf.set("k", "genuine", ttl=60)
    assert sf.get("k").value == "genuine"  # verified once: the same bytes are not verified again
    raw = bytearray(client.get(keys("k").value))
    offset, mask = SIGNED_BYTES[where]
    raw[offset] ^= mask
    client.set(keys("k").value, bytes(raw))
    assert sf.get("k") is None
    assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "v1"


def test_a_value_copied_to_another_key_is_a_miss(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver(signing_key=KEY)
    sf.set("admin-page", "for admins", ttl=60)
    assert sf.get("admin-page").value == "for admins"
    client.set(keys("public-page").value, client.get(keys("admin-page").value))
    assert sf.get("public-page") is None
    assert sf.get_or_rebuild("public-page", lambda: "for everyone", ttl=60) == "for everyone"


def test_invalidate_marks_a_signed_value_stale_in_place(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    # The stale flag is outside the signature (Redis sets it in place): the
    # value still verifies, and serves stale. Raising fresh_until instead
    # breaks the signature (test_an_altered_value_is_a_miss).
    sf = make_driver(signing_key=KEY)
    sf.set("k", "old", ttl=60, stale_ttl=600)
    assert sf.invalidate("k") is True
    assert sf.get("k").fresh_until == 0.0
    assert sf.get("k").value == "old"  # served stale, still verified
    assert sf.get_or_rebuild("k", lambda: "new", ttl=60, background=True) == "old"


def test_integers_are_signed_too(make_driver: Any, client: redis.Redis, keys: KeySpace) -> None:
    sf = make_driver(signing_key=KEY)
    forged = header(KIND, INT_CODEC, fresh_until=9e9, created_at=0.0, duration=0.0) + b"1337"
    client.set(keys("n").value, forged)
    assert sf.get("n") is None
    assert sf.incr("n", 1) is None  # a forged integer is no integer to add to
    assert client.get(keys("n").value) == forged
    sf.set("n", 10, ttl=60)
    assert sf.incr("n", 5) == 15
    assert sf.incr("n", -20) == -5
    assert sf.get("n").value == -5
    raw = bytearray(client.get(keys("n").value))
    raw[-1:] = b"9"
    client.set(keys("n").value, bytes(raw))
    assert sf.get("n") is None
    assert sf.incr("n") is None


def test_signed_incr_and_touch_keep_their_contracts(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver(signing_key=KEY)
    sf.set("s", "text", ttl=60)
    with pytest.raises(TypeError, match="'s'"):
        sf.incr("s")
    sf.set("n", 2**63 - 2, ttl=60)
    with pytest.raises(OverflowError, match="'n'"):
        sf.incr("n", 5)
    assert sf.incr("n") == 2**63 - 1
    ttl_before = client.pttl(keys("n").value)
    assert sf.touch("n", ttl=3600) is True
    assert sf.get("n").value == 2**63 - 1
    assert client.pttl(keys("n").value) > ttl_before
    assert sf.get("n").fresh_until > sf.get("s").fresh_until + 3000
    assert sf.touch("absent", ttl=60) is False


def test_concurrent_signed_increments_are_all_counted(make_driver: Any) -> None:
    sf = make_driver(signing_key=KEY)
    sf.set("counter", 0, ttl=60)

    def add_25() -> None:
        for _ in range(25):
            sf.incr("counter")

    assert run_threads(16, add_25) == [None] * 16  # none raised
    assert sf.get("counter").value == 400


def test_signed_and_unsigned_instances_read_each_other_as_misses(make_driver: Any) -> None:
    signed = make_driver(signing_key=KEY)
    unsigned = make_driver()
    signed.set("a", "signed", ttl=60)
    unsigned.set("b", "unsigned", ttl=60)
    assert unsigned.get("a") is None
    assert signed.get("b") is None


def test_keys_rotate_sign_with_the_first_accept_any(make_driver: Any) -> None:
    before = make_driver(signing_key=OLD_KEY)
    before.set("k", "written before the rotation", ttl=60)
    during = make_driver(signing_key=[KEY, OLD_KEY])
    assert during.get("k").value == "written before the rotation"
    during.set("k2", "written during it", ttl=60)
    assert before.get("k2") is None  # signed with the new key
    after = make_driver(signing_key=KEY.decode())  # a str key is its UTF-8 bytes
    assert after.get("k2").value == "written during it"
    assert after.get("k") is None


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        (b"short", "at least 16 bytes"),
        ([], "empty"),
        (12345, "bytes or str"),
        ([KEY, 5], "bytes or str"),
    ],
)
def test_bad_signing_keys_are_refused_naming_the_argument(
    client: redis.Redis, setting: Any, words: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"signing_key.*{words}"):
        stampede.Stampede(client, signing_key=setting)


def test_no_key_is_ever_shown(client: redis.Redis) -> None:
    signer = Signer([KEY, OLD_KEY])
    assert KEY.decode() not in repr(signer)
    assert "2 key" in repr(signer)
    sf = stampede.Stampede(client, signing_key=KEY)
    assert KEY.decode() not in repr(sf)
    with pytest.raises(ConfigurationError) as error:
        stampede.Stampede(client, signing_key=b"tooshort-secret")
    assert "tooshort" not in str(error.value)


def test_a_planted_value_is_refused_by_the_pickle_it_would_be() -> None:
    # The fixture's check is live: loading the plant does run it.
    pickle.loads(pickle.dumps(Planted()))
    assert RAN == ["planted"]
    RAN.clear()
