"""What the tests, the benchmarks and the demo share and the library does not ship:
app servers (waitress, gunicorn, uvicorn, hypercorn, daphne) run as process groups
that end with the process that started them."""
