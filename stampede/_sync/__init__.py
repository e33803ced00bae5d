"""The blocking flavour, generated from ``stampede/_async/`` by ``tools/unasync.py``: never edit by hand."""
