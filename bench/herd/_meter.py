"""How many Redis commands each phase cost: ``total_commands_processed`` from ``INFO stats``,
sampled on the phase's server just before it starts and once every caller is done."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis

from .._common.phase import Phase

__all__ = ["CommandMeter"]


class CommandMeter:
    """Samples each phase's server around the phase; :attr:`commands` maps a phase's index to the
    commands its server processed meanwhile, less the meter's own ``INFO``."""

    def __init__(self, phases: Sequence[Phase], urls: Mapping[str, str]) -> None:
        self.phases = phases
        self.urls = urls
        self.clients = {url: redis.Redis.from_url(url, socket_timeout=10.0) for url in set(urls.values())}
        self.commands: dict[int, int] = {}
        self._started: dict[int, int] = {}
        # What one sample adds to the count by itself (the INFO command), measured on an idle
        # server rather than assumed; the least of a few tries, in case anything else ran.
        self._own = {url: min(self._cost_of_a_sample(url) for _ in range(3)) for url in self.clients}

    def _total(self, url: str) -> int:
        return int(self.clients[url].info("stats")["total_commands_processed"])

    def _cost_of_a_sample(self, url: str) -> int:
        first = self._total(url)
        return self._total(url) - first

    def start(self, index: int) -> None:
        self._started[index] = self._total(self.urls[self.phases[index].peer])

    def end(self, index: int) -> None:
        url = self.urls[self.phases[index].peer]
        if index in self._started:
            self.commands[index] = self._total(url) - self._started[index] - self._own[url]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
