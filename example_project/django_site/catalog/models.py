"""A product: what the product pages show."""

from __future__ import annotations

from django.db import models


class Product(models.Model):
    name = models.CharField(max_length=100)
    price = models.DecimalField(max_digits=10, decimal_places=2)

    def __str__(self) -> str:
        return str(self.name)

    @property
    def tag(self) -> str:
        """The cache tag of every page that shows this product."""
        return f"product:{self.pk}"
