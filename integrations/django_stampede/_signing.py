"""The keys a cache signs its values with: ``OPTIONS["SIGNING_KEY"]``, or keys
derived from ``SECRET_KEY`` as Django derives those of its own signatures."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.crypto import salted_hmac

import stampede

__all__ = ["signing_keys"]

#: What Django's key derivation is salted with for this use of SECRET_KEY.
_SIGNING_SALT = "django_stampede.cache.values"


def signing_keys(raw: dict[str, Any]) -> tuple[bytes, ...] | None:
    """The keys values are signed with: ``OPTIONS["SIGNING_KEY"]`` as given
    (``None`` or ``False``: unsigned), else derived from ``SECRET_KEY`` and
    ``SECRET_KEY_FALLBACKS`` by Django's ``salted_hmac``, as Django derives
    the keys of its own signatures, so rotating ``SECRET_KEY`` rotates them."""
    if "SIGNING_KEY" in raw:
        given = raw["SIGNING_KEY"]
        if given is None or given is False:
            return None
        try:
            signer = stampede.signer_from(given, "OPTIONS['SIGNING_KEY']")
        except stampede.ConfigurationError as exc:  # it names the setting
            raise ImproperlyConfigured(f"django_stampede: {exc}") from None
        assert signer is not None
        return signer.keys
    try:
        secret = settings.SECRET_KEY
    except ImproperlyConfigured:  # Django's "must not be empty": answered below, in our terms
        if not settings.configured:
            raise
        secret = ""
    if not secret:
        raise ImproperlyConfigured(
            "django_stampede: StampedeCache signs the values it stores with a key derived from "
            "SECRET_KEY, and SECRET_KEY is empty: set SECRET_KEY, or give the cache "
            "OPTIONS['SIGNING_KEY']: a key of 16 bytes or more (or a list of them, the first "
            "signing), or None to store values unsigned, for a Redis no one else can write to"
        )
    secrets = [secret, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    return tuple(
        salted_hmac(_SIGNING_SALT, "signing key", secret=secret, algorithm="sha256").digest()
        for secret in secrets
    )
