"""The errors a user can act on.

A :class:`UserError` means the input is wrong (a config value, a data file, a reward file, a model folder, the
run folder), not the code: its message names the input and the fix. The entry scripts print it on one line,
without a traceback, and exit with status 2 (:func:`grpo_rl.cli.entry.run_entry`). Every other exception keeps its
traceback. This module is the bottom layer: it imports nothing from the package.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: the message names the input (key, file, folder) and how to fix it."""


class ConfigError(UserError, ValueError):
    """A configuration value is invalid; the message names the key and how to fix it."""


class DataError(UserError, ValueError):
    """A data file cannot be read or lacks what the task needs (names the file, the line and the fix)."""


class RunFolderError(UserError):
    """The run folder cannot be used as asked (another run's checkpoints, a checkpoint of another model)."""


class RoleFailed(RuntimeError):
    """A role of the run (a collector, a reference replica, a learner rank, a weight transfer) died or did not
    answer within ``pipeline.timeout_seconds``; the message names the role. The run stops after a checkpoint at the
    last step boundary (exit status 1)."""


class LearnerLost(RoleFailed):
    """A rank of a learner group died or did not answer: the group cannot go on without it. The loop starts the
    group again from the last checkpoint (``train.max_restarts``), or the run ends naming the rank."""
