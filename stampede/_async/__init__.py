"""The asyncio flavour: the one source of the drivers, from which ``stampede/_sync/`` is generated."""
