"""Stopping a run: the time limit and signals act between the phases of a step, a step's row and its checkpoint
are never separated, and a run folder never mixes two runs."""

from __future__ import annotations

import os
import signal
import time

import pytest
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.errors import RunFolderError
from grpo_rl.run.checkpoint import load_trainer_state
from grpo_rl.run.checkpoint_manager import CheckpointManager
from grpo_rl.run.lifecycle import check_run_folder
from grpo_rl.run.metrics import RunLogger, read_jsonl
from grpo_rl.run.step_log import StepLog
from grpo_rl.run.stopping import GracefulStop, Stopper, StopRun
from tests.unit.run.test_checkpoint_atomic import _Env, _Learner


def _cfg(tmp_path, **train):
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.output_dir = str(tmp_path)
    cfg.logger.num_examine = 0
    for key, value in train.items():
        cfg.train[key] = value
    return cfg


@pytest.fixture
def logger(tmp_path):
    logger = RunLogger(tmp_path, backend="none")
    yield logger
    logger.close()


class _Run:
    """The loop's three objects over a stand-in learner and source."""

    def __init__(self, cfg, tmp_path, logger, tokenizer=None, model=None, signals=None):
        self.learner, self.env = _Learner(model), _Env()
        self.stopper = Stopper(cfg.train, signals)
        self.steps = StepLog(cfg, tmp_path, logger)
        self.checkpoints = CheckpointManager(cfg, tmp_path, self.learner, self.env, tokenizer, self.steps)

    def record_step(self) -> None:
        self.steps.record({"reward_mean": 0.5}, batch=None)
        self.checkpoints.step_done()

    def one_step(self) -> None:
        """A whole step as the loop runs it: collect, check, train, record."""
        self.env.position += 2
        self.stopper.between_phases("generation")
        self.learner.version += 1
        self.record_step()

    def summary(self) -> str:
        return self.steps.outcome(
            started=self.stopper.started,
            stopped_because=self.stopper.stopped_because,
            resumed_from=None,
            last_checkpoint=self.checkpoints.last_checkpoint,
        ).summary


def test_the_time_limit_abandons_a_step_before_the_update(tmp_path, logger, tiny_model, tokenizer):
    run = _Run(_cfg(tmp_path, max_time_minutes=1.0), tmp_path, logger, tokenizer, tiny_model)
    run.checkpoints.resume(weight_sync=None)
    assert run.stopper.running(run.steps.step)
    run.one_step()
    assert run.stopper.running(run.steps.step)
    run.env.position += 2  # step 2 has drawn its prompts when the limit passes
    run.stopper.started -= 61
    with pytest.raises(StopRun, match=r"train.max_time_minutes=1.0 reached during step 2, after generation"):
        run.stopper.between_phases("generation")
    assert not run.stopper.running(run.steps.step)
    run.checkpoints.finish(run.stopper.stopped_because)
    saved = load_trainer_state(run.checkpoints.store.latest())
    assert saved["step"] == 1 and saved["env"] == {"position": 2}  # the boundary, not step 2's prompts
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]
    assert "stopped early: train.max_time_minutes=1.0 reached" in run.summary()


def test_no_limit_never_stops(tmp_path, logger):
    stopper = Stopper(_cfg(tmp_path, max_time_minutes=None).train)
    stopper.started -= 10**6
    assert stopper.should_stop() is None
    stopper.between_phases("generation")


def test_sigterm_and_sigint_stop_at_the_next_phase_and_a_second_one_at_once(tmp_path, logger):
    before = signal.getsignal(signal.SIGTERM)
    stop = GracefulStop().install()
    try:
        stopper = Stopper(_cfg(tmp_path).train, stop)
        assert stopper.running(0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs between bytecodes of the main thread
        assert stopper.should_stop() == "SIGTERM received"
        with pytest.raises(StopRun, match="SIGTERM received during step 1"):
            stopper.between_phases("generation")
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers in place before are back


def test_a_failure_before_the_row_is_written_leaves_no_checkpoint_of_that_step(tmp_path, logger, tiny_model, tokenizer):
    """The row comes first: a step whose logging failed is not checkpointed, and resuming redoes it."""
    run = _Run(_cfg(tmp_path, checkpoint_frequency=1), tmp_path, logger, tokenizer, tiny_model)
    run.checkpoints.resume(weight_sync=None)
    run.one_step()
    run.env.position += 2
    run.learner.version += 1

    def broken(step, metrics):
        raise OSError("stats could not be gathered")

    logger.log = broken
    with pytest.raises(OSError):
        run.record_step()
    run.checkpoints.finish()  # the learner moved past the boundary: nothing more is written
    assert run.steps.step == 1
    assert [p.name for p in run.checkpoints.store.list()] == ["step_00000001"]
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]


def test_a_fresh_run_refuses_a_folder_with_another_runs_checkpoints(tmp_path):
    (tmp_path / "checkpoints" / "step_00000010").mkdir(parents=True)
    with pytest.raises(RunFolderError, match="already holds checkpoints up to step_00000010.*resume=auto.*output_dir"):
        check_run_folder(_cfg(tmp_path), tmp_path)
    cfg = _cfg(tmp_path)
    cfg.resume = "auto"
    check_run_folder(cfg, tmp_path)  # continuing it is what resume=auto is for


def test_a_fresh_run_refuses_a_folder_with_another_runs_metrics(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunFolderError, match="the metrics of an earlier run"):
        check_run_folder(_cfg(tmp_path), tmp_path)


def test_an_empty_or_new_folder_is_fine(tmp_path):
    check_run_folder(_cfg(tmp_path), tmp_path / "new")
    (tmp_path / "metrics.jsonl").write_text("")
    check_run_folder(_cfg(tmp_path), tmp_path)


def test_resuming_with_another_model_is_refused_before_anything_starts(tmp_path, logger, tiny_model, tokenizer):
    cfg = _cfg(tmp_path, checkpoint_frequency=1)
    cfg.model.name = "/models/a"
    run = _Run(cfg, tmp_path, logger, tokenizer, tiny_model)
    run.checkpoints.resume(weight_sync=None)
    run.one_step()
    resumed = _cfg(tmp_path)
    resumed.resume, resumed.model.name = "auto", "/models/b"
    with pytest.raises(RunFolderError, match="trained with model.name=/models/a, not /models/b"):
        check_run_folder(resumed, tmp_path)
    resumed.model.name = "/models/a"
    check_run_folder(resumed, tmp_path)


def test_a_missing_resume_checkpoint_is_a_user_error(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.resume = str(tmp_path / "nowhere")
    with pytest.raises(RunFolderError, match="not a checkpoint folder"):
        check_run_folder(cfg, tmp_path)


@pytest.mark.parametrize("resume", [None, "auto"])
def test_an_output_dir_that_is_a_file_is_a_user_error(tmp_path, resume):
    file = tmp_path / "notes.txt"
    file.write_text("not a run")
    cfg = _cfg(tmp_path)
    cfg.resume = resume
    with pytest.raises(RunFolderError) as info:
        check_run_folder(cfg, file)
    assert str(info.value) == (
        f"output_dir={file} is a file, so the run cannot write there; set output_dir to a "
        "folder (it is made if it does not exist), or move that file away"
    )
    with pytest.raises(RunFolderError, match=rf"^output_dir={file / 'run'} is inside {file}, which is a file"):
        check_run_folder(cfg, file / "run")


def test_a_final_checkpoint_that_fails_on_a_failing_run_leaves_the_runs_own_error(
    tmp_path, logger, tiny_model, tokenizer, caplog
):
    """A run ending on an error whose final checkpoint fails too (the learner's rank was gone by then) ends with
    its own error, the checkpoint's logged; a run ending well whose final checkpoint fails ends with that."""
    from grpo_rl.errors import LearnerLost, RoleFailed
    from grpo_rl.run.loop import finish_checkpoints

    run = _Run(_cfg(tmp_path, checkpoint_frequency=2), tmp_path, logger, tokenizer, tiny_model)
    run.checkpoints.resume(weight_sync=None)
    run.one_step()
    run.one_step()  # checkpointed
    run.one_step()

    def gone() -> dict:
        raise LearnerLost("learner rank 1 (pid 7) died during a checkpoint (its process was killed or crashed)")

    run.learner.state_dict = gone
    first = RoleFailed("a learner rank failed during a training step (its log is above): peer closed")
    with caplog.at_level("WARNING", logger="grpo_rl.run.loop"):
        assert finish_checkpoints(run.checkpoints, run.stopper, failure=first) is False
    (message,) = [r.getMessage() for r in caplog.records if r.name == "grpo_rl.run.loop"]
    assert message.startswith("no final checkpoint: learner rank 1 (pid 7) died during a checkpoint")
    assert message.endswith(f"resume=auto continues from {run.checkpoints.store.latest()}")
    assert [p.name for p in run.checkpoints.store.list()] == ["step_00000002"]
    with pytest.raises(LearnerLost, match="died during a checkpoint"):
        finish_checkpoints(run.checkpoints, run.stopper, failure=None)
