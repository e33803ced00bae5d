"""What ``with`` does for every throwaway server here: ``close()`` on the way out."""

from __future__ import annotations

from types import TracebackType

__all__ = ["ClosedOnExit"]


class ClosedOnExit:
    """Closed when its ``with`` block ends, however it ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
