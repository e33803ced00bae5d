"""What truly differs between the asyncio and the blocking flavour, side by side.

The drivers are written once, for asyncio (``stampede/_async/``), and the
blocking twin is generated from them by ``tools/unasync.py``, which renames
every ``AsyncX`` here to its ``X`` (and ``async_x`` to ``x``) and drops
``await``. So each primitive comes in two classes or functions with the same
methods: the asyncio one first, then its blocking twin. Everything else is
the same code. By job: waiting (events, locks, sleep), work that outlives
its caller (shielding, background work, the rebuild), an instance's life
(closing, forking), and the subscriber's listening.
"""

from __future__ import annotations

from .lifecycle import async_close_client as async_close_client
from .lifecycle import async_forks_with as async_forks_with
from .lifecycle import close_client as close_client
from .lifecycle import forks_with as forks_with
from .listening import AsyncListener as AsyncListener
from .listening import AsyncTrackingConnection as AsyncTrackingConnection
from .listening import Listener as Listener
from .listening import Message as Message
from .listening import TrackingConnection as TrackingConnection
from .listening import async_close_node_pubsub as async_close_node_pubsub
from .listening import async_close_pubsub as async_close_pubsub
from .listening import close_node_pubsub as close_node_pubsub
from .listening import close_pubsub as close_pubsub
from .listening import close_sockets as close_sockets
from .waiting import AsyncEvent as AsyncEvent
from .waiting import AsyncLock as AsyncLock
from .waiting import AsyncSectionLock as AsyncSectionLock
from .waiting import Event as Event
from .waiting import Lock as Lock
from .waiting import SectionLock as SectionLock
from .waiting import async_can_block as async_can_block
from .waiting import async_current_owner as async_current_owner
from .waiting import async_sleep as async_sleep
from .waiting import can_block as can_block
from .waiting import current_owner as current_owner
from .waiting import on_event_loop_thread as on_event_loop_thread
from .waiting import sleep as sleep
from .work import AsyncBackground as AsyncBackground
from .work import AsyncDetached as AsyncDetached
from .work import AsyncRebuilder as AsyncRebuilder
from .work import AsyncWorker as AsyncWorker
from .work import Background as Background
from .work import Detached as Detached
from .work import Rebuilder as Rebuilder
from .work import Worker as Worker
from .work import async_contextmanager as async_contextmanager
from .work import async_rebuild_call as async_rebuild_call
from .work import async_runs_in_thread as async_runs_in_thread
from .work import async_shield as async_shield
from .work import check_background_workers as check_background_workers
from .work import contextmanager as contextmanager
from .work import rebuild_call as rebuild_call
from .work import runs_in_thread as runs_in_thread
from .work import shield as shield

__all__ = [
    "AsyncBackground",
    "AsyncDetached",
    "AsyncEvent",
    "AsyncListener",
    "AsyncLock",
    "AsyncRebuilder",
    "AsyncSectionLock",
    "AsyncTrackingConnection",
    "AsyncWorker",
    "Background",
    "Detached",
    "Event",
    "Listener",
    "Lock",
    "Message",
    "Rebuilder",
    "SectionLock",
    "TrackingConnection",
    "Worker",
    "async_can_block",
    "async_close_client",
    "async_close_node_pubsub",
    "async_close_pubsub",
    "async_contextmanager",
    "async_current_owner",
    "async_forks_with",
    "async_rebuild_call",
    "async_runs_in_thread",
    "async_shield",
    "async_sleep",
    "can_block",
    "check_background_workers",
    "close_client",
    "close_node_pubsub",
    "close_pubsub",
    "close_sockets",
    "contextmanager",
    "current_owner",
    "forks_with",
    "on_event_loop_thread",
    "rebuild_call",
    "runs_in_thread",
    "shield",
    "sleep",
]
