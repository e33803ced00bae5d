"""What a cached view stores: a snapshot of its response, not the response object."""

from __future__ import annotations

import time
from dataclasses import dataclass

from flask import Response

__all__ = ["Snapshot"]

# Never replayed from a cache: they describe one connection, not the page.
_NOT_STORED = {"set-cookie", "content-length", "date", "connection", "transfer-encoding", "keep-alive"}


@dataclass(frozen=True)
class Snapshot:
    """A response's status, headers and body (a streamed body joined), and
    until when it is fresh."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    fresh_until: float

    @classmethod
    def of(cls, response: Response, ttl: float | None) -> Snapshot:
        headers = tuple(
            (name, value) for name, value in response.headers.items() if name.lower() not in _NOT_STORED
        )
        fresh_until = float("inf") if ttl is None else time.time() + ttl
        return cls(response.status_code, headers, response.get_data(), fresh_until)

    def response(self) -> Response:
        return Response(self.body, status=self.status, headers=list(self.headers))

    def fresh(self) -> bool:
        return time.time() < self.fresh_until
