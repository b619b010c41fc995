"""When a run stops before ``train.steps``: SIGINT, SIGTERM and ``train.max_time_minutes``.

SIGINT (Ctrl-C) and SIGTERM (a scheduler's preemption, ``timeout``) and the time limit are checked before each
step (:meth:`Stopper.running`) and between its phases (:meth:`Stopper.between_phases`): before the learner update
the step is abandoned (:class:`StopRun`), after it the step is finished. Either way the run stops within one
phase, and :meth:`grpo_rl.run.checkpoint_manager.CheckpointManager.finish` checkpoints its last completed step and
says so. A second signal stops at once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

log = logging.getLogger(__name__)


class StopRun(Exception):
    """The run must stop in the middle of a step (signal, time limit); raised before the learner update."""


class GracefulStop:
    """First SIGINT (Ctrl-C) or SIGTERM: stop at the next phase boundary; a second one stops at once.

    :meth:`install` in the main thread before anything slow starts, check :attr:`requested` (the signal's name,
    or None), :meth:`restore` the previous handlers at the end.
    """

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def install(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        log.warning(
            "%s: stopping at the next phase boundary and checkpointing the last completed step (send it "
            "again to stop at once)",
            self.requested,
        )


class Stopper:
    """Says whether the run goes on: steps left, no signal, time left; remembers why it stopped.

    Args:
        train: the ``train`` slice of the config (``steps``, ``max_time_minutes``).
        signals: the run's signal handlers, or None.
        started: :func:`time.monotonic` at the run's start (now if None).
    """

    def __init__(self, train, signals: GracefulStop | None = None, started: float | None = None):
        self.steps, self.max_time_minutes = train.steps, train.max_time_minutes
        self.signals = signals
        self.started = time.monotonic() if started is None else started
        self.stopped_because: str | None = None
        self._step = 1  # the step in progress
        self._first_step: int | None = None
        self._step_started = self.started

    def should_stop(self) -> str | None:
        """Why the run must stop now (a signal, the time limit), or None."""
        if self.stopped_because is None:
            if self.signals is not None and self.signals.requested:
                self.stopped_because = f"{self.signals.requested} received"
            elif self.out_of_time():
                self.stopped_because = f"train.max_time_minutes={self.max_time_minutes} reached"
        return self.stopped_because

    def out_of_time(self) -> bool:
        limit = self.max_time_minutes
        return limit is not None and (time.monotonic() - self.started) / 60 >= limit

    def running(self, done: int) -> bool:
        """The loop's condition, given the steps ``done``: steps left and no reason to stop. Call once at the top of
        every step."""
        if done >= self.steps or self.should_stop() is not None:
            return False
        self._step, self._step_started = done + 1, time.monotonic()
        if self._first_step is None:  # the slowest step (kernels compile, caches fill): show its phases
            self._first_step = self._step
            log.info(
                "step %d/%d started: generation, then reference scoring and training (%.0f s since start)",
                self._first_step,
                self.steps,
                time.monotonic() - self.started,
            )
        return True

    def between_phases(self, phase: str) -> None:
        """Call between the phases of a step that come before the learner update: raises :class:`StopRun`
        (the step is abandoned) when the run must stop."""
        if self._step == self._first_step:
            log.info(
                "step %d: %s done (%.1f s into the step)",
                self._first_step,
                phase,
                time.monotonic() - self._step_started,
            )
        reason = self.should_stop()
        if reason is not None:
            raise StopRun(f"{reason} during step {self._step}, after {phase}: step {self._step} abandoned")
