"""Reward functions and their weighted combination.

A reward function is a plain callable ``(responses, references) -> list[float]``: one number per response,
``references[i]`` being whatever the task knows about prompt ``i``'s answer (a GSM8K answer string, an IFEval
instruction list, a user's ``ground_truth``). Rule-based rewards are therefore testable without a model.

:class:`CompositeReward` combines named components with weights and keeps each component, so every one
can be logged separately. A component that raises (``sys.exit`` included), returns a non-number or the wrong
count, or runs past its time limit does not end the run: the affected samples get ``fallback`` for that
component, the failure is counted and recorded with the offending sample (cut to :data:`MAX_EXAMPLE_CHARS`), and
only a step in which every sample failed with an error raises. Numbers are Python or NumPy scalars (bools
included), or a NumPy array or tensor of them. A component marked ``none_is_no_reward`` (a function written for
TRL) may return None for an answer: that answer gets ``fallback`` and is counted as a failure, but is not retried
and never makes a step raise.

A component with ``timeout_seconds`` runs in a worker thread, and the step stops waiting for it after that
long (:mod:`grpo_rl.envs.time_limit`, which tools use too; the function runs off the main thread, so it cannot
install signal handlers). Python cannot stop a thread, so a call that never returns is abandoned, not killed: it
keeps running (and using CPU) in the background until it returns or the process ends. To bound that, a step stops
retrying a component after :data:`MAX_RETRY_TIMEOUTS` timed-out retries, and a component with
:data:`MAX_ABANDONED_CALLS` abandoned calls still running is not called again until some of them return.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import numbers
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpo_rl.envs.time_limit import MAX_ABANDONED_CALLS, CallTimeout, call_with_time_limit, still_running
from grpo_rl.errors import UserError

log = logging.getLogger(__name__)

RewardFn = Callable[[Sequence[str], Sequence[Any]], Sequence[float]]


# Longest response or error text kept in a failure's log line and record: a runaway response or a huge
# exception message must not flood the log.
MAX_EXAMPLE_CHARS = 300
# After this many timed-out retries in one step, the component's other samples are not retried.
MAX_RETRY_TIMEOUTS = 2


class RewardError(UserError, RuntimeError):
    """Every sample of a step failed in a reward function: the function is broken, not one answer. The run stops
    (a user error: one message, exit status 2) with the last completed step checkpointed."""


class NoReward(Exception):
    """A function following TRL's convention returned None for an answer: no reward for it (not an error)."""


def _no_reward() -> NoReward:
    return NoReward("returned None: no reward for this answer (TRL's convention); it gets reward.fallback")


class RewardTimeout(CallTimeout):
    """A reward call ran past its component's ``timeout_seconds`` and was abandoned (or was not made); ``thread`` is
    its still running thread, None when no call was made."""


@dataclass
class RewardComponent:
    """One named, weighted reward function."""

    name: str
    fn: RewardFn
    weight: float = 1.0
    timeout_seconds: float | None = None  # per call, then its samples fail (None: none; reward.timeout_seconds)
    # TRL's convention: a None in the returned list gets the fallback and counts as a failure, without a retry
    # (a step of all None does not raise)
    none_is_no_reward: bool = False
    origin: str | None = None  # file.py:function, for messages (a user's file as configured); None: from fn

    def where(self) -> str:
        """``file.py:function`` of the component's code (:attr:`origin`, else :func:`function_origin`)."""
        return self.origin or function_origin(self.fn)


_PACKAGE_PARENT = Path(__file__).resolve().parents[3]  # the folder holding grpo_rl/


def function_origin(fn: Callable) -> str:
    """``file.py:qualified.name`` of the code behind ``fn``: partials, decorators and bound methods are unwrapped,
    a callable object is named by its class; a file of this package is given from ``grpo_rl/`` on, a file under
    the working directory relative to it, other files in full, code without a file (a C function) by its module."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    if not (inspect.isfunction(target) or inspect.isclass(target) or inspect.isbuiltin(target)):
        target = type(target)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    try:
        file = Path(inspect.getsourcefile(target) or inspect.getfile(target)).resolve()
    except (TypeError, OSError):
        return f"{getattr(target, '__module__', None) or '?'}:{name}"
    for root in (_PACKAGE_PARENT / "grpo_rl", Path.cwd()):
        if file.is_relative_to(root):
            file = file.relative_to(root.parent if root.name == "grpo_rl" else root)
            break
    return f"{file}:{name}"


@dataclass
class RewardResult:
    """``total``: ``[N]`` reward, ``(weighted sum + bias) * scale``; ``components``: name -> ``[N]`` unweighted values;
    ``failures``: name -> count; ``unscaled``: ``[N]`` weighted sum before ``scale`` and ``bias`` (None when they
    leave it unchanged)."""

    total: torch.Tensor
    components: dict[str, torch.Tensor]
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: list[dict] = field(default_factory=list)
    unscaled: torch.Tensor | None = None


class CompositeReward:
    """A weighted sum of named reward components with per-sample failure isolation, then shifted and scaled:
    ``reward = (sum_c weight_c * value_c + bias) * scale``; a sample whose component failed gets ``fallback``."""

    def __init__(
        self, components: Sequence[RewardComponent], *, fallback: float = 0.0, scale: float = 1.0, bias: float = 0.0
    ):
        if not components:
            raise ValueError("a reward needs at least one component")
        self.components = list(components)
        self.fallback = fallback
        self.scale = scale
        self.bias = bias
        self._abandoned: dict[str, list[threading.Thread]] = {}  # per component: timed-out calls still running

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_abandoned"] = {}  # threads do not pickle, and belong to this process anyway
        return state

    def __call__(self, responses: Sequence[str], references: Sequence[Any], **extra: Sequence[Any]) -> RewardResult:
        n = len(responses)
        total = torch.zeros(n, dtype=torch.float32)
        values: dict[str, torch.Tensor] = {}
        failures: dict[str, int] = {}
        examples: list[dict] = []
        for comp in self.components:
            vals, failed, errors = self._evaluate(comp, responses, references, extra)
            # A timeout or a declared "no reward" is not proof that the function is broken.
            excused = any(e.get("timed_out") or e.get("no_reward") for e in errors)
            if failed == n and n > 0 and not excused:
                raise RewardError(
                    f"reward {comp.name!r} ({comp.where()}) failed on every sample of the step, so it "
                    f"cannot score this task; fix the function (and test it on a few responses), then "
                    f"resume with resume=auto. First failure: {errors[0]}"
                )
            if failed:
                failures[comp.name] = failed
                examples.extend(errors[:3])
                log.warning(
                    "reward %r (%s) failed on %d/%d samples; first: %s", comp.name, comp.where(), failed, n, errors[0]
                )
            values[comp.name] = vals
            total += comp.weight * vals
        if not self.rescales:
            return RewardResult(total=total, components=values, failures=failures, failure_examples=examples)
        return RewardResult(
            # AReaL's (reward + reward_bias) * reward_scaling; with advantages scaled by the group's std the scale
            # cancels out, without (Dr. GRPO) it sets the gradient's size
            total=(total + self.bias) * self.scale,
            components=values,
            failures=failures,
            failure_examples=examples,
            unscaled=total,
        )

    @property
    def rescales(self) -> bool:
        """Whether ``scale`` and ``bias`` change the weighted sum (then it is kept too, as ``unscaled``)."""
        return self.scale != 1.0 or self.bias != 0.0

    def _evaluate(self, comp: RewardComponent, responses, references, extra) -> tuple[torch.Tensor, int, list[dict]]:
        """Call the component on the batch; on failure, retry sample by sample to isolate the bad ones."""
        n = len(responses)
        limit = comp.timeout_seconds
        abandoned = self._abandoned.setdefault(comp.name, [])
        # A function that hangs costs a few limits per step and a few threads in all, not one of each per sample:
        # not called with MAX_ABANDONED_CALLS still running, retries stopped after MAX_RETRY_TIMEOUTS timed out.
        if still_running(abandoned) >= MAX_ABANDONED_CALLS:
            skipped = RewardTimeout(
                f"not called: {len(abandoned)} earlier calls are still running past "
                f"reward.timeout_seconds={limit:g}; make the function faster or raise the limit"
            )
            return (
                torch.full((n,), self.fallback, dtype=torch.float32),
                n,
                [_failure(comp, i, skipped, responses[i]) for i in range(n)],
            )
        try:
            vals, missing = self._check(
                comp.name, _call(comp, responses, references, extra, limit), n, comp.none_is_no_reward, self.fallback
            )
            return vals, len(missing), [_failure(comp, i, _no_reward(), responses[i]) for i in missing]
        except KeyboardInterrupt:
            raise
        except BaseException as batch_error:  # noqa: BLE001 - a user's function may raise anything, even SystemExit
            if isinstance(batch_error, RewardTimeout) and batch_error.thread is not None:
                abandoned.append(batch_error.thread)
            if n == 1:
                return torch.full((1,), self.fallback), 1, [_failure(comp, None, batch_error, responses[0])]
        vals = torch.full((n,), self.fallback, dtype=torch.float32)
        errors: list[dict] = []
        timeouts = 0
        for i in range(n):
            try:
                if timeouts >= MAX_RETRY_TIMEOUTS:
                    raise RewardTimeout(
                        f"not retried: the function already timed out on {timeouts} samples of "
                        f"this step (reward.timeout_seconds={limit:g})"
                    )
                one_extra = {k: [v[i]] for k, v in extra.items()}
                one, missing = self._check(
                    comp.name,
                    _call(comp, [responses[i]], [references[i]], one_extra, limit),
                    1,
                    comp.none_is_no_reward,
                    self.fallback,
                )
                if missing:
                    raise _no_reward()
                vals[i] = one[0]
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: BLE001
                if isinstance(e, RewardTimeout) and e.thread is not None:
                    timeouts += 1
                    abandoned.append(e.thread)
                errors.append(_failure(comp, i, e, responses[i]))
        return vals, len(errors), errors

    @staticmethod
    def _check(
        name: str, out: Any, n: int, allow_none: bool = False, fallback: float = 0.0
    ) -> tuple[torch.Tensor, list[int]]:
        """``out`` as ``[n]`` floats and the indices of its Nones (given ``fallback``; only with ``allow_none``)."""
        if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
            out = out.tolist()  # a NumPy array or a tensor: plain Python numbers
        if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
            raise TypeError(
                f"reward {name!r} returned {_clip(repr(out))}; it must return a list of numbers, one per response"
            )
        out = list(out)
        if len(out) != n:
            raise ValueError(f"reward {name!r} returned {len(out)} values for {n} responses")
        vals, missing = [], []
        for i, v in enumerate(out):
            if v is None and allow_none:
                missing.append(i)
                vals.append(fallback)
                continue
            number = _as_number(v)
            if number is None:
                raise TypeError(f"reward {name!r} returned {_clip(repr(v))}; it must return finite numbers")
            vals.append(number)
        return torch.tensor(vals, dtype=torch.float32), missing


def _as_number(v: Any) -> float | None:
    """``v`` as a finite float if it is a real number (NumPy scalars and bools included), else None."""
    if not isinstance(v, numbers.Real) and hasattr(v, "item") and getattr(v, "ndim", None) == 0:
        v = v.item()  # a NumPy scalar (np.bool_ is no numbers.Real) or a 0-d tensor
    if not isinstance(v, numbers.Real):
        return None
    try:
        number = float(v)
    except (OverflowError, ValueError, TypeError):  # an int too large for a float
        return None
    return number if math.isfinite(number) else None


def _call(comp: RewardComponent, responses, references, extra: dict, timeout: float | None):
    """``comp.fn(responses, references, **extra)``, abandoned with :class:`RewardTimeout` after ``timeout`` seconds
    (:func:`~grpo_rl.envs.time_limit.call_with_time_limit`: a daemon thread that runs on until the function
    returns); the worker computes with the caller's grad mode, which torch keeps per thread."""
    grad = torch.is_grad_enabled()

    def call():
        with torch.set_grad_enabled(grad):
            return comp.fn(responses, references, **extra) if extra else comp.fn(responses, references)

    if timeout is None:
        return call()
    return call_with_time_limit(
        call,
        timeout,
        name=f"reward-{comp.name}",
        error=RewardTimeout,
        message=(
            f"timed out after reward.timeout_seconds={timeout:g} and was abandoned (it may still be running); "
            "make the function faster or raise reward.timeout_seconds"
        ),
    )


def _describe(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return (
            f"SystemExit({error.code!r}): the reward function called sys.exit() (or exit()); return a list of "
            "numbers, or raise an exception, instead"
        )
    if isinstance(error, (RewardTimeout, NoReward)):
        return f"{type(error).__name__}: {error}"
    try:
        return repr(error)
    except Exception:  # noqa: BLE001 - a user's exception whose __repr__ itself fails
        return f"{type(error).__name__} (its repr() failed)"


def _clip(text: str, limit: int = MAX_EXAMPLE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text)} chars]"


def _failure(comp: RewardComponent, index: int | None, error: BaseException, response: Any) -> dict:
    """The record of one failed sample, its texts cut so that a huge response or message cannot flood the log."""
    record: dict[str, Any] = {"reward": comp.name}
    if index is not None:
        record["index"] = index
    record["error"] = _clip(_describe(error))
    record["response"] = _clip(response if isinstance(response, str) else repr(response))
    if isinstance(error, RewardTimeout):
        record["timed_out"] = True
    if isinstance(error, NoReward):
        record["no_reward"] = True
    return record
