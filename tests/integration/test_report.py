"""The report of a real run: the tiny synchronous script writes report.html (refreshed during the run and once at
the end) with its token data, and headless Chromium opens it from the file system without a console error and
draws each part. The browser checks skip where no Chromium is installed (Debian: apt-get install chromium).

``GRPO_REPORT_SCREENSHOTS=<folder>`` keeps the screenshots there instead of in the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import NOT_VLLM, run_script, tiny_overrides
from tests.unit.cli.test_report import embedded, make_run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
PARTS = ("curves", "timeline", "answers", "events")


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("report_run")
    proc = run_script(
        "grpo.py",
        *tiny_overrides(tiny_model_dir, run_dir, steps=4),
        NOT_VLLM,
        "eval.every=2",
        "eval.num_prompts=2",
        "logger.examine_every=1",
        "report.every=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_a_run_writes_its_report(tiny_run: Path):
    data = embedded((tiny_run / "report.html").read_text())
    titles = [p["title"] for p in data["panels"]]
    assert {"reward (train batch mean)", "KL", "step time by phase (s)", "held-out evaluation"} <= set(titles)
    (run,) = data["runs"]
    assert sorted(map(int, run["samples"])) == [1, 2, 3, 4]
    answers = run["samples"]["4"][0]["answers"]
    assert len(answers) == 4  # the whole group of G = 4
    first = answers[0]
    assert len(first["tokens"]) == len(first["logprob"]) == len(first["learner_logprob"]) > 0
    assert 0 < len(first["tokens"]) <= 16
    assert first["policy_version"] == 3  # sync: step 4 sampled with the weights of 3 updates
    # the synchronous loop samples with the learner's own weights (float32 both): no gap, nothing cut
    assert max(abs(a - b) for a, b in zip(first["logprob"], first["learner_logprob"], strict=True)) < 1e-2
    assert first["engine_outside"] == []
    assert "driver / loop" in run["timeline"]["lanes"] and [s for s, _ in run["timeline"]["steps"]] == [1, 2, 3, 4]
    assert "learner" in (tiny_run / "report.html").read_text()  # the placement table


def chromium(url: str, *flags: str) -> subprocess.CompletedProcess:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--enable-logging=stderr"]
        + ["--v=0", "--window-size=1400,1000", *flags, url],
        capture_output=True,
        text=True,
        timeout=180,
    )


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def look(report: Path, out: Path, name: str, query: str) -> str:
    """Screenshot ``report?query`` into ``out/name.png`` and return its DOM once the script ran; no console error."""
    url = report.resolve().as_uri() + "?" + query
    shot = chromium(url, f"--screenshot={out / (name + '.png')}")
    assert (out / f"{name}.png").stat().st_size > 10_000, shot.stderr[-2000:]
    dom = chromium(url, "--dump-dom")
    assert console_errors(shot.stderr + dom.stderr) == []
    assert 'data-ready="1"' in dom.stdout  # the script ran to its end
    return dom.stdout


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("GRPO_REPORT_SCREENSHOTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    return out


@needs_chromium
def test_chromium_opens_the_tiny_runs_report(tiny_run: Path, screenshots: Path):
    report = tiny_run / "report.html"
    doms = {part: look(report, screenshots, f"tiny_{part}", f"part={part}&color=logprob") for part in PARTS}
    assert doms["curves"].count('class="panel"') >= 10
    assert len(re.findall(r"<rect [^>]*fill=\"#d62728\"", doms["timeline"])) >= 1  # a train span
    coloured = re.findall(r'<span class="tok"[^>]*style="background: rgba?\(255, 140, 0', doms["answers"])
    assert len(coloured) >= 2 * 4 * 8  # 2 groups x 4 answers, each token coloured by its engine log-prob
    assert "Placement" in doms["events"]


@needs_chromium
def test_chromium_draws_gaps_turns_and_a_sweep(tmp_path: Path, screenshots: Path):
    sweep = tmp_path / "sweep"
    make_run(sweep / "0", lr="1e-5", restart=True)
    make_run(sweep / "1", lr="3e-5", steps=6)
    from grpo_rl.cli.report import main

    report = main([str(sweep)])
    dom = look(report, screenshots, "sweep_answers", "part=answers&step=2&color=gap")
    assert 'class="turn tool"' in dom  # the tool token is a turn of its own
    # learner - engine: +0.1 on the first token (faint red), -1.5 on the second (blue, the scale's end)
    assert "background: rgba(214, 39, 40, 0.2)" in dom and "background: rgb(31, 119, 180)" in dom
    dom = look(report, screenshots, "sweep_curves", "part=curves")
    assert "optimizer.lr=3e-5: reward_mean" in dom
    dom = look(report, screenshots, "sweep_events", "part=events")
    assert "learner group replaced" in dom
    assert json.loads(json.dumps(embedded(report.read_text())["x"])) == [1, 6]
