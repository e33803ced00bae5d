"""How many connections a redis-server holds at its busiest, sampled while a load runs."""

from __future__ import annotations

import threading

import redis

from ._closing import ClosedOnExit


class ConnectionPeak(ClosedOnExit):
    """``with ConnectionPeak(url) as peak: ...``; then ``peak.peak`` is the most connections seen,
    less the ``baseline`` (the count when the block began, this poller's own connection included)."""

    def __init__(self, url: str, *, interval: float = 0.010) -> None:
        """``interval``: seconds between two samples. Connections opened and
        closed between two samples go unseen: the peak is a lower bound."""
        self.interval = interval
        self._client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="stampede-connection-peak", daemon=True)
        self.baseline = 0
        self.highest = 0
        self.samples = 0
        #: Why polling stopped early (the server went away, say), if it did.
        self.error: str | None = None

    @property
    def peak(self) -> int:
        return max(0, self.highest - self.baseline)

    def _sample(self) -> int:
        return int(self._client.info("clients")["connected_clients"])

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                count = self._sample()
            except redis.RedisError as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self.samples += 1
            self.highest = max(self.highest, count)

    def __enter__(self) -> ConnectionPeak:
        try:
            self.baseline = self.highest = self._sample()
        except BaseException:
            self._client.close()
            raise
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop sampling, after one last look."""
        self._stop.set()
        self._thread.join(10.0)
        try:
            # One last look: the peak may be right at the end.
            self.highest = max(self.highest, self._sample())
        except redis.RedisError:
            pass
        finally:
            self._client.close()
