"""The example's database, made when a server process starts: a demo
convenience (a real site runs ``manage.py migrate`` when it deploys)."""

from __future__ import annotations

import fcntl
from decimal import Decimal

from django.conf import settings
from django.core.management import call_command

#: What a new database holds.
PRODUCTS = (
    ("Espresso machine", Decimal("249.00")),
    ("Grinder", Decimal("129.00")),
    ("Kettle", Decimal("49.00")),
)


def prepare_database() -> None:
    """Migrate and seed the database, once however many processes start together."""
    from .models import Product

    with open(f"{settings.DATABASES['default']['NAME']}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # server processes start together
        call_command("migrate", interactive=False, verbosity=0)
        if not Product.objects.exists():
            Product.objects.bulk_create(Product(name=name, price=price) for name, price in PRODUCTS)
