"""When a product is saved, every page tagged with it goes stale, in every
process: served stale while one request renders it again."""

from __future__ import annotations

from typing import Any

from django.core.cache import cache
from django.db.models.signals import post_save
from django.dispatch import receiver

from .models import Product


@receiver(post_save, sender=Product)
def pages_showing_it_go_stale(sender: type[Product], instance: Product, **kwargs: Any) -> None:
    invalidate_tags = getattr(cache, "invalidate_tags", None)
    if invalidate_tags is not None:  # Django's own RedisCache has no groups: its pages wait for expiry
        invalidate_tags(instance.tag)
