"""Run a server's ``python -m`` entry point in a process that ends, with its whole process group, as
soon as its parent does: ``python .../_guard.py MODULE [ARG...]``, its stdin a pipe from the parent.

:class:`support.app_servers.AppServer` starts every app server so. The parent never
writes to the pipe; when its end closes (the parent closed it, or died and the kernel closed it),
this process kills its process group (the server and the workers it forked or spawned, started in
a session of their own) with SIGKILL: no server outlives what started it, even a parent killed
with no chance to clean up. Server command lines have no option for that.

Why this shape:

- In the server's own process, not a wrapper process around it: the process the parent holds is
  the server itself, so its pid, its exit code and its connections are the server's, and no layer
  has to pass signals on.
- Run by its file path, not with ``-m``: the child imports nothing of this repository (only the
  standard library), so it needs no import path of its own and starts as fast as ``python -m
  MODULE``; ``sys.path[0]`` is then made the working directory, as ``-m`` makes it.
- Stdlib only, and naming no app or framework: the core's import rules hold here too.

SIGINT, SIGTERM and SIGHUP are reset to their default action and unblocked first: a server started
by a process that ignored them (a background job, ``nohup``) would inherit that, and the stop
signals would then be lost on it.
"""

from __future__ import annotations

import os
import runpy
import signal
import stat
import sys
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _die_with_parent() -> None:
    while os.read(0, 4096):  # the parent writes nothing: this returns b"" when its end closes
        pass
    if os.getpgrp() == os.getpid():  # the leader of a group of its own, as AppServer starts it
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _stdin_is_a_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(0).st_mode)
    except OSError:  # no stdin at all
        return False


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.executable} {__file__} MODULE [ARG...]")
    module, args = sys.argv[1], sys.argv[2:]
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if _stdin_is_a_pipe():  # only a parent's pipe says when the parent is gone
        threading.Thread(target=_die_with_parent, name="stampede-exit-with-parent", daemon=True).start()
    sys.argv = [module, *args]
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = os.getcwd()  # as -m has it (under -P or PYTHONSAFEPATH neither adds one)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
