"""Compression: large values stored smaller, read back by either algorithm,
and never a way to exhaust memory."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import redis

from stampede import Compressed, ConfigurationError, JsonSerializer, PickleSerializer, serializer_from
from stampede._core.codec import encode
from stampede._core.envelope import CODEC_AT, KIND, header
from stampede._core.keys import KeySpace
from tests.helpers import payload_of


def zstd_compress(data: bytes) -> bytes:
    try:
        from compression import zstd  # type: ignore[import-not-found]

        return zstd.compress(data)  # type: ignore[no-any-return]
    except ImportError:
        import zstandard

        return zstandard.ZstdCompressor().compress(data)


PAGE = {"html": "<li>an item of a long, repetitive page</li>" * 500}


@pytest.mark.parametrize("algorithm", ["zlib", "zstd"])
def test_large_values_are_stored_compressed(
    make_driver: Any, client: redis.Redis, keys: KeySpace, algorithm: str
) -> None:
    sf = make_driver(serializer=Compressed(JsonSerializer(), algorithm))
    assert sf.get_or_rebuild("page", lambda: PAGE, ttl=60) == PAGE
    assert len(client.get(keys("page").value)) < len(str(PAGE)) // 20
    sf.set("small", [1, 2], ttl=60)
    assert payload_of(client.get(keys("small").value))[1:] == b"[1,2]"  # below min_size: as it is
    assert sf.get("small").value == [1, 2]


def test_either_algorithm_reads_the_other(make_driver: Any) -> None:
    writer = make_driver(serializer=Compressed(PickleSerializer(), "zstd"))
    reader = make_driver(serializer=serializer_from("pickle+zlib"))
    writer.set("page", PAGE, ttl=60)
    assert reader.get("page").value == PAGE


def test_compressed_and_plain_values_are_misses_to_each_other(make_driver: Any) -> None:
    compressed = make_driver(serializer=Compressed(JsonSerializer()))
    plain = make_driver(serializer=JsonSerializer())
    compressed.set("a", PAGE, ttl=60)
    plain.set("b", PAGE, ttl=60)
    assert plain.get("a") is None
    assert compressed.get("b") is None


@pytest.mark.parametrize("algorithm", ["zlib", "zstd"])
def test_a_decompression_bomb_is_a_miss(
    make_driver: Any, client: redis.Redis, keys: KeySpace, algorithm: str
) -> None:
    serializer = Compressed(JsonSerializer(), max_size=1024 * 1024)
    sf = make_driver(serializer=serializer)
    plain = b" " * 50_000_000
    packed = b"\x01" + zlib.compress(plain) if algorithm == "zlib" else b"\x02" + zstd_compress(plain)
    bomb = header(KIND, serializer.codec_id, fresh_until=9e9, created_at=0, duration=0) + packed
    client.set(keys("k").value, bomb)
    assert sf.get("k") is None
    assert sf.get_or_rebuild("k", lambda: "rebuilt", ttl=60) == "rebuilt"


def test_signed_and_compressed(make_driver: Any) -> None:
    sf = make_driver(serializer=serializer_from("json+zstd"), signing_key=b"0123456789abcdef0123")
    assert sf.get_or_rebuild("page", lambda: PAGE, ttl=60) == PAGE
    assert sf.get("page").value == PAGE


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Compressed(JsonSerializer(), "lz4"), "algorithm must be 'zlib' or 'zstd'"),
        (lambda: Compressed(JsonSerializer(), min_size=-1), "min_size"),
        (lambda: Compressed(Compressed()), "serializer to wrap"),
        (lambda: serializer_from("yaml+zlib"), "'yaml' is not 'pickle' or 'json'"),
        (lambda: serializer_from("json+brotli"), "algorithm must be"),
    ],
)
def test_bad_compression_settings_say_what_is_wrong(make: Any, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        make()


def test_the_envelope_of_an_uncompressed_value_is_unchanged() -> None:
    # What a reader without compression sees: a codec of its own, so a miss.
    data = encode(Compressed(JsonSerializer()), [1], fresh_until=1.0, created_at=0.0, duration=0.0)
    assert data[CODEC_AT] == JsonSerializer.codec_id + 128
