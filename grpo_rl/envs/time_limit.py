"""Calling a user's code (a reward function, a tool) under a time limit, so that a call that hangs costs its samples
or its tool call, not the run.

The call runs in a daemon thread that inherits the caller's context variables, and the caller stops waiting after
the limit (a signal-based alarm would need the main thread, and user code may install its own handlers). Python
cannot stop a thread, so a call past its limit is abandoned, not killed: it runs on (and uses CPU) until it returns
or the process ends. The caller keeps the abandoned threads and stops calling a function that has
:data:`MAX_ABANDONED_CALLS` of them still running (:func:`still_running`), so a function that never returns costs a
few limits and a few threads in all, not one of each per call.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# A function with this many timed-out calls still running is not called (its calls count as timed out at once).
MAX_ABANDONED_CALLS = 4


class CallTimeout(Exception):
    """A call ran past its time limit and was abandoned (or was not made); ``thread`` is its still running thread,
    None when no call was made."""

    def __init__(self, message: str, thread: threading.Thread | None = None):
        super().__init__(message)
        self.thread = thread


def call_with_time_limit(
    fn: Callable[[], T], timeout: float, *, name: str, message: str, error: type[CallTimeout] = CallTimeout
) -> T:
    """``fn()``, or ``error(message, thread)`` raised after ``timeout`` seconds while ``fn`` still runs in a thread
    called ``name`` (for stack dumps of a hung process); whatever ``fn`` raises is raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller, SystemExit included
            box["error"] = e

    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(run,), name=name, daemon=True)
    worker.start()
    worker.join(max(timeout, 0.0))
    if worker.is_alive():
        raise error(message, worker)
    if "error" in box:
        raise box["error"]
    return box["out"]


def still_running(abandoned: list[threading.Thread]) -> int:
    """Drop the threads of ``abandoned`` that have finished (in place); returns how many still run."""
    abandoned[:] = [t for t in abandoned if t.is_alive()]
    return len(abandoned)
