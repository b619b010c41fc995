"""A collector's live request stream (grpo_rl.distributed.actors._AdmittedGroups), without Ray or an engine: groups
are drawn only once admitted; with groups in flight it never waits (it asks, and has nothing while the answer is no,
while weights wait to be loaded or an evaluation waits); with none in flight it waits for admission with the engine
lock released; with whole batches it draws ``P`` at a time and nothing more until they are done."""

from __future__ import annotations

import itertools
import threading
import time

from grpo_rl.distributed.actors import _AdmittedGroups


class Worker:
    """The collector's state the stream reads; ``admit`` answers each admission request."""

    def __init__(self, admit=lambda g, wait: True, whole_batches: bool = False):
        self.admit, self.whole_batches = admit, whole_batches
        self._stop, self._evaluating = threading.Event(), threading.Event()
        self._pending = None
        self._outbox: list = []
        self._engine_lock = threading.Lock()
        self._engine_call_started = None
        self.asked: list[tuple] = []  # (group or groups, wait, engine lock held while asking)

    def _admitted(self, g, wait: bool = True) -> bool:
        self.asked.append((list(g) if isinstance(g, list) else g, wait, self._engine_lock.locked()))
        return self.admit(g, wait)


def stream(worker: Worker, per_batch: int = 2, owed=None) -> _AdmittedGroups:
    return _AdmittedGroups(worker, iter(owed) if owed is not None else itertools.count(), per_batch)


def test_with_groups_in_flight_a_refused_group_is_asked_again_later_never_waited_for():
    answers = iter([True, False, True, True])
    worker = Worker(admit=lambda g, wait: next(answers))
    groups = stream(worker, owed=[0, 2, 4, 6])
    with worker._engine_lock:  # the collector's loop holds it while the engine streams
        assert groups.draw() == 0  # nothing in flight: asked with a wait, the lock released meanwhile
        assert groups.draw() is None  # one in flight, refused: nothing now
        assert groups.draw() is None  # asked again too soon after a no: not even asked
        time.sleep(_AdmittedGroups.ASK_SECONDS)
        assert groups.draw() == 2  # the same group, admitted now
        assert groups.draw() == 4  # a yes is no reason to wait before the next
    assert worker.asked == [(0, True, False), (2, False, True), (2, False, True), (4, False, True)]
    assert groups.in_flight == 3


def test_weights_waiting_a_full_buffer_or_an_evaluation_drain_the_engine_first():
    worker = Worker()
    groups = stream(worker)
    with worker._engine_lock:
        assert groups.draw() == 0
        worker._pending = (1, object())  # weights to load: only between groups
        assert groups.draw() is None
        worker._pending = None
        worker._outbox.append("a group the buffer had no room for")  # backpressure: nothing new starts
        assert groups.draw() is None
        worker._outbox.clear()
        worker._evaluating.set()
        assert groups.draw() is None
        groups.in_flight = 0  # group 0 finished
        worker._evaluating.clear()
        assert groups.draw() == 1


def test_an_evaluation_waiting_goes_first_when_the_engine_is_idle():
    worker = Worker()
    groups = stream(worker)
    worker._evaluating.set()
    done = []

    def evaluation():
        with worker._engine_lock:
            done.append(time.monotonic())
        worker._evaluating.clear()

    with worker._engine_lock:
        thread = threading.Thread(target=evaluation)
        thread.start()
        assert groups.draw() == 0  # it released the lock and took it back only after the evaluation
        drawn = time.monotonic()
    thread.join()
    assert done and done[0] <= drawn


def test_whole_batches_draw_p_groups_at_once_and_none_until_they_are_done():
    worker = Worker(whole_batches=True)
    groups = stream(worker, per_batch=3)
    with worker._engine_lock:
        assert [groups.draw() for _ in range(4)] == [0, 1, 2, None]
        groups.in_flight = 1
        assert groups.draw() is None  # the batch is not done
        groups.in_flight = 0
        assert groups.draw() == 3
    # each batch's groups admitted together, never asked for with groups in flight
    assert [(groups, wait) for groups, wait, _ in worker.asked] == [([0, 1, 2], True), ([3, 4, 5], True)]


def test_a_stop_ends_the_stream():
    worker = Worker()
    groups = stream(worker)
    worker._stop.set()
    assert groups.draw() is None and worker.asked == []
