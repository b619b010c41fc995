"""The CUDA path, on a machine with a GPU (skipped elsewhere): the numerics the CPU suite checks, on the GPU, and
the synchronous script on one GPU, where the default allocation puts every role on it.

Run there with ``pytest tests/gpu``. Float32 on the GPU differs from the CPU by summation order (TF32 is off), so
the tolerances are relative and about 1e-4; bf16 autocast keeps 8 bits of mantissa, so it is compared at 2e-2."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.training.learner import Learner, LossSettings
from tests.integration.helpers import read_metrics, run_script, tiny_overrides
from tests.unit.model.test_packing import GROUPS, grouped_batch
from tests.unit.training.test_learner import _accum_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double().cpu() - want.double().cpu()).norm() / want.double().cpu().norm()).item()


@pytest.mark.parametrize("share_prompt", [False, True])
def test_logprobs_and_gradients_on_cuda_equal_the_cpu(tiny_model, share_prompt):
    batch = grouped_batch(GROUPS)
    weights = torch.randn(batch["response_ids"].shape, generator=torch.Generator().manual_seed(0))

    def run(model, device):
        model.zero_grad(set_to_none=True)
        out = sequence_logprobs(model, batch.to(device), with_entropy=True, share_prompt=share_prompt)
        (out.logprobs * weights.to(device)).sum().backward()
        return out, [p.grad for p in model.parameters()]

    want, want_grads = run(tiny_model, CPU)
    got, got_grads = run(copy.deepcopy(tiny_model).to(CUDA), CUDA)
    assert got.logprobs.device == CUDA
    assert _relative(got.logprobs, want.logprobs) < 1e-5
    assert _relative(got.entropy, want.entropy) < 1e-5
    assert (got.logprobs.cpu()[batch["response_mask"] == 0] == 0).all()
    for g_got, g_want in zip(got_grads, want_grads, strict=True):
        assert _relative(g_got, g_want) < 1e-4


def test_packed_logprobs_under_bf16_autocast_on_cuda(tiny_model):
    batch = grouped_batch(GROUPS).to(CUDA)
    model = copy.deepcopy(tiny_model).to(CUDA).eval()
    with torch.no_grad():
        want = sequence_logprobs(model, batch).logprobs
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = sequence_logprobs(model, batch, share_prompt=True).logprobs
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert _relative(got, want) < 2e-2


@pytest.mark.parametrize("bf16", [False, True])
def test_a_learner_step_on_cuda_equals_the_cpu(tiny_model, bf16):
    settings = LossSettings(aggregation="token_mean", kl_coef=0.05, tis_cap=2.0)
    batch = _accum_batch(tiny_model)
    metrics, weights = [], []
    for device in (CPU, CUDA):
        model = copy.deepcopy(tiny_model).to(device)
        learner = Learner(
            model, device, settings, lr=1e-3, micro_batch_tokens=20, bf16_autocast=bf16 and device.type == "cuda"
        )
        metrics.append(learner.train_step(batch.clone()))
        weights.append(torch.cat([p.detach().cpu().flatten() for p in model.parameters()]))
    cpu, cuda = metrics
    assert cuda["num_micro_batches"] == cpu["num_micro_batches"] == 5
    tol = 2e-2 if bf16 else 1e-4
    for key in ("loss", "loss_policy", "loss_kl", "grad_norm"):
        assert cuda[key] == pytest.approx(cpu[key], rel=tol, abs=tol * 1e-2), key
    start = torch.cat([p.detach().flatten() for p in tiny_model.parameters()])
    moved_cpu, moved_cuda = weights[0] - start, weights[1] - start
    assert moved_cpu.abs().max() > 0
    # Adam's first step moves each weight by about lr * sign(grad): the two devices agree on nearly every sign.
    assert (torch.sign(moved_cpu) == torch.sign(moved_cuda)).float().mean() > (0.95 if bf16 else 0.999)


def test_the_sync_script_on_one_gpu_runs_resumes_and_logs_each_step_once(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    common = [
        *tiny_overrides(tiny_model_dir, out, steps=2),
        "inference_model.engine=transformers",
        "train.checkpoint_frequency=1",
    ]
    common = [o for o in common if "precision=" not in o]  # auto: bf16 on a GPU with bf16
    first = run_script("grpo.py", *common)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    log = first.stdout + first.stderr
    assert "train: [cuda:0]  ref: [cuda:0]  inference: [cuda:0]" in log, log[-4000:]
    assert "bfloat16" in log
    resumed = run_script(
        "grpo.py", *[o for o in common if not o.startswith("train.steps=")], "train.steps=3", "resume=auto"
    )
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    steps = [m["step"] for m in read_metrics(out) if "loss" in m]
    assert steps == [1, 2, 3]  # two steps, then the third after the resume: each once
    for m in read_metrics(out):
        if "loss" in m:
            assert all(torch.isfinite(torch.tensor(float(m[k]))) for k in ("loss", "kl_ref", "grad_norm"))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_default_engine_without_vllm_names_the_install(tiny_model_dir, tmp_path):
    result = run_script("grpo.py", *tiny_overrides(tiny_model_dir, tmp_path / "run"))
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "vllm==0.32.0" in errors[0], result.stderr[-3000:]


def test_the_compiled_static_cache_engine_samples_what_the_eager_one_does(tiny_model_dir):
    from grpo_rl.engines.base import SamplingSpec
    from grpo_rl.engines.transformers_engine import TransformersEngine

    prompts = [[11, 12, 13, 14, 15], [21, 22], [31, 32, 33, 34, 35, 36, 37]]
    greedy = SamplingSpec(max_new_tokens=24, temperature=0.0)
    eager = TransformersEngine(str(tiny_model_dir), CUDA, dtype="float32").generate(prompts, 2, greedy)
    engine = TransformersEngine(str(tiny_model_dir), CUDA, dtype="float32", compile=True)
    compiled = engine.generate(prompts, 2, greedy)
    assert torch.equal(compiled["response_ids"], eager["response_ids"])
    assert _relative(compiled["behavior_logprobs"], eager["behavior_logprobs"]) < 1e-4
    sampled = engine.generate(prompts, 4, SamplingSpec(max_new_tokens=24, temperature=1.0, seed=3))
    lp = sampled["behavior_logprobs"][sampled["response_mask"].bool()]
    assert lp.numel() > 0 and (lp <= 0).all() and torch.isfinite(lp).all()
