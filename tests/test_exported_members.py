"""The public surface is what ``__all__`` says, and nothing private leaks into it."""

from __future__ import annotations

import stampede
import stampede.asyncio


def test_all_names_exist_and_are_public() -> None:
    for name in stampede.__all__:
        assert hasattr(stampede, name), name
        assert not name.startswith("_")
    assert sorted(stampede.__all__) == stampede.__all__


def test_every_public_attribute_is_in_all() -> None:
    public = {
        name
        for name in dir(stampede)
        if not name.startswith("_")
        and name not in {"asyncio", "testing", "prometheus", "opentelemetry", "cli", "annotations"}
    }
    assert public == set(stampede.__all__)


def test_what_the_framework_adapters_use_is_public() -> None:
    # The adapters use the core's public names only: these, besides Stampede.
    used = {"check_connection_options", "redis_url_kind", "redact_url", "redis_client", "serializer_from"}
    assert used | {"signer_from", "hook_from", "NearCache", "Options", "LeaseScope"} <= set(stampede.__all__)
    assert {"redis_client", "for_running_loop"} <= set(stampede.asyncio.__all__)


def test_every_error_derives_from_stampede_error() -> None:
    errors = [getattr(stampede, name) for name in stampede.__all__ if name.endswith("Error")]
    assert len(errors) == 8
    for error in errors:
        assert issubclass(error, stampede.StampedeError)


def test_the_drivers_offer_the_same_methods() -> None:
    def methods(cls: type) -> set[str]:
        return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}

    assert methods(stampede.Stampede) - {"close"} == methods(stampede.asyncio.Stampede) - {"aclose"}
