"""Work that outlives its caller, by flavour: shielding, background work, a
worker beside the caller, and running a rebuild function."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from .._exceptions import ConfigurationError

T = TypeVar("T")

#: A rebuild function: asyncio's may be a coroutine function or a plain
#: callable (run in a worker thread); a blocking one is called in place.
AsyncRebuilder = Callable[[], "Awaitable[T] | T"]
Rebuilder = Callable[[], T]


def check_background_workers(workers: Any) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigurationError(
            f"background_workers must be an int >= 1, got {workers!r}", field="background_workers"
        )
    return int(workers)


# --- outliving the caller: shielding, background work ---------------------------


async def async_shield(work: Awaitable[T]) -> T:
    """``work``, carried to its end even if the caller is cancelled meanwhile."""
    return await asyncio.shield(work)


def shield(work: T) -> T:
    """A blocking call is not cancelled: ``work`` is already done."""
    return work


class AsyncBackground:
    """Work an instance starts that outlives the call that started it (a
    refresh served stale meanwhile, a release retried, a cancelled caller's
    commit): tasks of the running loop. Refreshes (``bounded``) run at most
    ``workers`` at once, as with threads; the rest must not queue behind a
    slow refresh, or the lease they settle could lapse meanwhile."""

    def __init__(self, workers: int) -> None:
        self._workers = check_background_workers(workers)
        self._running: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self, work: Callable[[], Coroutine[Any, Any, None]], name: str, *, bounded: bool = True
    ) -> None:
        """Start ``work()``; ``RuntimeError`` when it cannot be (no running loop)."""
        loop = asyncio.get_running_loop()
        if bounded:
            if self._running is None:
                self._running = asyncio.Semaphore(self._workers)
            task = loop.create_task(self._run(self._running, work), name=name)
        else:
            task = loop.create_task(work(), name=name)
        # Keep a reference: the loop holds tasks only weakly.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _run(running: asyncio.Semaphore, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        async with running:
            await work()

    async def join(self) -> None:
        """Wait for the work started so far to end."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def forked(self) -> None:
        """Nothing to do: an event loop does not come along into a forked child."""


class Background:
    """Work an instance starts that outlives the call that started it: a pool
    of ``workers`` threads, made when first needed, each piece of work run in
    the starting caller's context (its tracing span, its context variables),
    as an asyncio task would be."""

    def __init__(self, workers: int) -> None:
        self._workers = check_background_workers(workers)
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self, work: Callable[[], None], name: str, *, bounded: bool = True) -> None:
        """Start ``work()``; ``RuntimeError`` when it cannot be (the
        interpreter is shutting down). All of it runs in the pool: nothing
        of the blocking flavour settles a lease in the background (its
        rebuilds run in the caller's thread), and a retried release only
        matters while Redis fails."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="stampede-background")
            executor = self._executor
        executor.submit(contextvars.copy_context().run, work)

    def join(self) -> None:
        """Wait for the work started so far to end, and stop the threads."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def forked(self) -> None:
        """In a child process just forked: the threads did not come along."""
        self._executor = None
        self._lock = threading.Lock()


class AsyncWorker(Generic[T]):
    """``work()`` running beside the caller (a task), until it returns or is stopped."""

    def __init__(self, work: Callable[[], Coroutine[Any, Any, T]], name: str) -> None:
        self._task = asyncio.get_running_loop().create_task(work(), name=name)

    def done(self) -> bool:
        """Whether it has ended (returned, raised, was cancelled), or never
        will: its loop was closed with the task pending."""
        return self._task.done() or self._task.get_loop().is_closed()

    def stop(self, grace: float) -> T | None:
        """Its result if it ended, else ``None`` (and it is cancelled: a task
        can be, so ``grace`` is not waited)."""
        task = self._task
        if task.done():
            return None if task.cancelled() or task.exception() is not None else task.result()
        task.cancel()
        return None

    async def ended(self) -> None:
        """Wait until it has ended (after :meth:`stop`: its cancellation
        handled, the connection it held given back), whatever it came to."""
        if not self.done():
            await asyncio.gather(self._task, return_exceptions=True)


class Worker(Generic[T]):
    """``work()`` running beside the caller (a daemon thread), until it returns."""

    def __init__(self, work: Callable[[], T], name: str) -> None:
        self._result: T | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), name=name, daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], T]) -> None:
        self._result = work()

    def done(self) -> bool:
        """Whether it has ended."""
        return not self._thread.is_alive()

    def stop(self, grace: float) -> T | None:
        """Its result if it ends within ``grace`` seconds, else ``None``: a
        thread cannot be stopped, so ``work`` must watch for a signal of its own."""
        self._thread.join(grace)
        return None if self._thread.is_alive() else self._result

    def ended(self) -> None:
        """Not waited for: a thread cannot be stopped, and ends by itself
        once ``work`` sees it should (a blocking call it is in ends first)."""


#: Context managers written as generators, by flavour.
async_contextmanager = contextlib.asynccontextmanager
contextmanager = contextlib.contextmanager


# --- running a rebuild function ----------------------------------------------------


def async_runs_in_thread(rebuild: Callable[[], Any]) -> bool:
    """Whether ``rebuild`` is a plain callable, run in a worker thread so that
    a slow rebuild never blocks the event loop."""
    return not inspect.iscoroutinefunction(rebuild)


def runs_in_thread(rebuild: Callable[[], Any]) -> bool:
    """A blocking rebuild runs in its caller's own thread."""
    return False


async def async_rebuild_call(rebuild: AsyncRebuilder[T]) -> T:
    """Run ``rebuild``: awaited if a coroutine function, else in a worker thread
    (and awaited if what it returned is awaitable)."""
    if inspect.iscoroutinefunction(rebuild):
        return await rebuild()  # type: ignore[no-any-return]
    value = await asyncio.to_thread(rebuild)
    if inspect.isawaitable(value):
        value = await value
    return value


def rebuild_call(rebuild: Rebuilder[T]) -> T:
    value = rebuild()
    if inspect.iscoroutine(value):  # an async function: nothing here can await it
        value.close()  # never awaited, on purpose: no RuntimeWarning
        inner = getattr(rebuild, "func", rebuild)  # a functools.partial's function
        name = getattr(inner, "__qualname__", None) or repr(inner)
        raise ConfigurationError(
            f"the rebuild function {name} returned a coroutine (it is an async function), which the "
            "blocking stampede.Stampede cannot await: use stampede.asyncio.Stampede for async "
            "functions (or make it a plain def)",
            field="rebuild",
        )
    return value


class AsyncDetached(BaseException):
    """A caller was cancelled while its rebuild runs on in a thread (which
    cannot be stopped): the rest of its flow (commit, release) belongs to
    that rebuild, whose outcome ``rebuilt()`` awaits."""

    def __init__(self, outcome: asyncio.Future[Any]) -> None:
        super().__init__()
        self._outcome = outcome

    @classmethod
    async def outlive(cls, work: Awaitable[T]) -> T:
        """``work``, shielded: a caller cancelled meanwhile gets this
        exception instead, and ``work`` goes on."""
        outcome = asyncio.ensure_future(work)
        try:
            return await asyncio.shield(outcome)
        except asyncio.CancelledError:
            raise cls(outcome) from None

    async def rebuilt(self) -> Any:
        return await self._outcome

    @staticmethod
    def cancellation() -> BaseException:
        """What the detached caller gets: its own cancellation."""
        return asyncio.CancelledError()


class Detached(BaseException):
    """Never raised: a blocking rebuild runs in its caller's thread, which
    nothing cancels. The class keeps the twin of the asyncio driver whole."""

    def __init__(self, outcome: Any) -> None:
        super().__init__()
        self._outcome = outcome

    @classmethod
    def outlive(cls, work: T) -> T:
        return work

    def rebuilt(self) -> Any:
        return self._outcome

    @staticmethod
    def cancellation() -> BaseException:
        return KeyboardInterrupt()
