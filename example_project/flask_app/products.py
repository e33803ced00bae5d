"""The Flask app's products, kept in Redis (the app has no database): one hash each."""

from __future__ import annotations

from decimal import Decimal

import redis

from ..settings import ExampleConfig

__all__ = ["Products"]

#: What the store holds before anything is edited.
PRODUCTS = {1: ("Espresso machine", "249.00"), 2: ("Grinder", "129.00"), 3: ("Kettle", "49.00")}


class Products:
    """Products by id, shared by every process of the app."""

    def __init__(self, settings: ExampleConfig) -> None:
        self._client = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
        self._prefix = f"{settings.key_prefix}:flask-product:"

    def get(self, pk: int) -> dict[str, str] | None:
        """The product ``pk`` (its name and price), or ``None``."""
        if pk not in PRODUCTS:
            return None
        name, price = PRODUCTS[pk]
        stored = self._client.hget(self._prefix + str(pk), "price")
        if isinstance(stored, bytes):
            price = stored.decode()
        return {"id": str(pk), "name": name, "price": price}

    def set_price(self, pk: int, price: Decimal) -> None:
        self._client.hset(self._prefix + str(pk), "price", str(price))

    def close(self) -> None:
        self._client.close()
