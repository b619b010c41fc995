"""Our policy objectives and engine correction against TRL 1.16's ``GRPOTrainer._compute_loss``: loss and gradient.

    bash benchmarks/versus_trl/setup_trl_env.sh          # once: TRL's own venv in benchmarks/.venv-trl
    benchmarks/.venv-trl/bin/python benchmarks/versus_trl/trl_objectives.py   # ~10 s; -> results/trl_objectives.json

Runs in TRL's venv. ``grpo_rl.algo.loss``, ``grpo_rl.algo.objectives`` and ``grpo_rl.algo.engine_correction`` need only
torch (2.13.0 in both venvs), so they are imported from the source tree; both sides see the same tensors in one process.

Inputs (fixed seed, fp32): 8 groups x 4 answers of 4-64 tokens, right-padded to 64 (the padding holds random
log-probs, so a side that forgot the mask would show it); group-normalised advantages (one group all equal:
zero advantages);
current per-token log-probs, and old, reference and engine log-probs that differ from them by a small Gaussian
plus rare large outliers (the heavy tail of real bf16-engine and stale-policy mismatch), so that the clip, CISPO's
cap and the engine weight's bounds act on some tokens (the fractions are printed).

TRL's side: ``GRPOTrainer._compute_loss`` called on a bare trainer (``object.__new__``) holding the attributes it
reads, copied from a real ``GRPOConfig`` as ``GRPOTrainer.__init__`` copies them, with a single-process
``Accelerator``. Its model forward (``_get_per_token_logps_and_entropies``) returns the injected current
log-probs, a leaf tensor, so both sides' gradients are taken w.r.t. the same per-token log-probs. TRL computes the
engine importance ratio (``inputs["importance_sampling_ratio"]``) in ``_generate_and_score_completions``, right
after generation; that block is cut verbatim from the installed source and run on the same tensors (the engine
cases set ``use_vllm=True`` and ``vllm_importance_sampling_correction=True``, which gate it and its use in
``_compute_loss``; no vLLM is needed). One optimizer step per generation batch
(``steps_per_generation=1``, no gradient accumulation), so ``num_items_in_batch`` is the batch's token count.

Our side: ``grpo_rl.algo.loss.grpo_loss`` with the aggregation chosen to match TRL's ``loss_type`` (``dapo`` and
``cispo``: token mean; ``grpo``: per-answer token mean, then mean over answers; ``dr_grpo``: token sum over
``max_completion_length``, mean over answers). KL coefficient 0.04 in every case, k3 estimator. TRL 1.16 defaults
to ``use_bias_correction_kl=True`` (the KL term multiplied by the differentiable policy ratio); ours has no such
weight, so the cases set it to False and one extra case shows the default's difference.

TRL 1.16 has no GSPO-token (``importance_sampling_level="sequence_token"`` lived in ``trl.experimental.gspo_token``,
which 1.16 no longer ships): our ``gspo_token`` is compared with TRL's sequence level, whose value and gradient it
must equal when every answer has one advantage.

SAPO is ``GRPOTrainer``'s ``loss_type="sapo"`` (per-answer token mean, as our default for ``sapo``). GMPO is
``trl.experimental.gmpo.GMPOTrainer._compute_loss`` with a ``GMPOConfig`` (its ``epsilon``/``epsilon_high`` are our
``gmpo_clip_eps``, in log space; it averages the KL per answer and takes no engine weight, so its cases have none).
Our ``token_band_mask`` (IcePop) is compared with TRL's ``token_mask`` given both bounds, IcePop's ``[0.5, 5]``:
IcePop keeps the ratio inside the band, which is what TRL's mask does. ``sequence_band_mask`` (a geometric mean
per answer) has no TRL counterpart; its unit tests check it by hand.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from grpo_rl.algo.loss import LossSettings, aggregate, grpo_loss, kl_estimate  # noqa: E402

GROUPS, GROUP_SIZE, T_MAX, MIN_LEN = 8, 4, 64, 4
KL_COEF = 0.04
GSPO_EPS = (3e-4, 4e-4)  # the GSPO paper's clip range
SURROGATE_EPS = (0.2, 0.28)  # DAPO's clip-higher


@dataclass
class Case:
    """One comparison: TRL's ``GRPOConfig`` fields and our ``grpo_loss`` keyword arguments."""

    name: str
    trl: dict
    ours: dict
    note: str = ""
    expect_equal: bool = True
    on_policy: bool = False  # old log-probs = the current ones, detached (one optimizer step per batch)
    trainer: str = "grpo"  # "grpo": GRPOTrainer/GRPOConfig; "gmpo": trl.experimental.gmpo's GMPOTrainer/GMPOConfig
    kl_times_ratio: bool = False  # also add TRL's KL weighting to ours: beta * aggregate(k3 * (ratio - 1))


def make_inputs(seed: int) -> dict[str, torch.Tensor]:
    """The fixed batch (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    B, T = GROUPS * GROUP_SIZE, T_MAX

    def noise(scale: float, p_outlier: float, outlier_scale: float) -> torch.Tensor:
        base = torch.randn(B, T, generator=g) * scale
        outlier = (torch.rand(B, T, generator=g) < p_outlier).float()
        return base + outlier * torch.randn(B, T, generator=g) * outlier_scale

    lengths = torch.randint(MIN_LEN, T + 1, (B,), generator=g)
    lengths[0] = T  # one answer fills the window
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # TRL's completion_mask is an integer tensor
    current = -torch.empty(B, T).exponential_(1.0, generator=g).clamp(max=12.0)  # [B, T] log pi(y_t)
    old = current - noise(0.1, 0.08, 1.0)  # the policy at the start of the update: ratio exp(current - old)
    ref = current - noise(0.1, 0.05, 1.0)
    engine = old - noise(0.03, 0.10, 1.0)  # the sampling engine's log-probs: weight exp(old - engine)
    rewards = (torch.rand(B, generator=g) < 0.4).float() + 0.2 * torch.rand(B, generator=g)
    rewards[:GROUP_SIZE] = 1.0  # one group with equal rewards: zero advantages, as in real batches
    grouped = rewards.view(GROUPS, GROUP_SIZE)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(B)
    return dict(mask=mask, current=current, old=old, ref=ref, engine=engine, advantages=adv, lengths=lengths)


def trl_importance_ratio_block() -> str:
    """The engine importance-ratio block of TRL's ``_generate_and_score_completions``, as installed."""
    from trl import GRPOTrainer

    lines = inspect.getsource(GRPOTrainer._generate_and_score_completions).splitlines()
    start = next(i for i, s in enumerate(lines) if "# Compute the importance sampling ratio when using vLLM" in s)
    end = next(i for i in range(start, len(lines)) if "# Compute the per-token log probabilities for" in lines[i])
    assert "vllm_importance_sampling_ratio = " in "\n".join(lines[start:end]), "TRL's source moved"
    return textwrap.dedent("\n".join(lines[start:end]))


def trl_side(case: Case, x: dict[str, torch.Tensor], is_block: str) -> dict:
    """TRL's loss, its gradient w.r.t. the current log-probs, its engine ratio and its metrics."""
    from accelerate import Accelerator

    if case.trainer == "gmpo":
        from trl.experimental.gmpo import GMPOConfig as GRPOConfig
        from trl.experimental.gmpo import GMPOTrainer as GRPOTrainer
    else:
        from trl import GRPOConfig, GRPOTrainer

    B, T = x["mask"].shape
    config = GRPOConfig(
        output_dir=str(Path(tempfile.gettempdir()) / "trl_objectives"),
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=B,
        num_generations=GROUP_SIZE,
        max_completion_length=T,
        beta=KL_COEF,
        **case.trl,
    )
    accelerator = Accelerator(cpu=True)  # after the config: building a config resets the accelerator state
    t = object.__new__(GRPOTrainer)
    # What GRPOTrainer.__init__ copies from the config, for the attributes _compute_loss reads.
    t.args = config
    t.beta = config.beta
    t.loss_type = config.loss_type
    t.importance_sampling_level = config.importance_sampling_level
    t.epsilon_low = config.epsilon
    t.epsilon_high = config.epsilon_high if config.epsilon_high is not None else config.epsilon
    t.use_vllm = config.use_vllm
    t.vllm_importance_sampling_correction = config.vllm_importance_sampling_correction
    t.vllm_importance_sampling_mode = config.vllm_importance_sampling_mode
    t.vllm_importance_sampling_clip_max = config.vllm_importance_sampling_clip_max
    t.vllm_importance_sampling_clip_min = config.vllm_importance_sampling_clip_min
    t.top_entropy_quantile = config.top_entropy_quantile
    t.off_policy_mask_threshold = config.off_policy_mask_threshold
    t.max_completion_length = config.max_completion_length
    t.entropy_coef = config.entropy_coef
    t.use_adaptive_entropy = config.use_adaptive_entropy
    t._entropy_bonus_enabled = t.entropy_coef != 0.0 or t.use_adaptive_entropy
    t.aux_loss_enabled = False
    t.model = SimpleNamespace(training=True)
    t.accelerator = accelerator
    t.current_gradient_accumulation_steps = 1
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}

    current = x["current"].clone().requires_grad_(True)  # [B, T] leaf: the "model's" per-token log-probs
    t._get_per_token_logps_and_entropies = lambda *a, **k: (current, torch.ones_like(current), None)
    mask = x["mask"]
    inputs = dict(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=torch.zeros(B, T, dtype=torch.long),
        completion_mask=mask,
        advantages=x["advantages"],
        ref_per_token_logps=x["ref"],
        num_items_in_batch=accelerator.gather(mask.sum()).sum(),
    )
    if not case.on_policy:  # TRL's on-policy path: no old_per_token_logps, the current ones detached
        inputs["old_per_token_logps"] = x["old"]
    ratio = None
    if t.use_vllm and t.vllm_importance_sampling_correction:
        scope = dict(
            self=t,
            torch=torch,
            math=math,
            completion_mask=mask,
            tool_mask=None,
            old_per_token_logps=x["old"],
            sampling_per_token_logps=x["engine"],
        )
        exec(is_block, scope)  # noqa: S102 - TRL's own code, cut from its installed source
        ratio = scope["vllm_importance_sampling_ratio"]
        inputs["importance_sampling_ratio"] = ratio
    loss = GRPOTrainer._compute_loss(t, None, inputs)
    loss.backward()
    metrics = {k: sum(v) / len(v) for k, v in t._metrics["train"].items()}
    return dict(loss=loss.detach(), grad=current.grad, ratio=ratio, metrics=metrics)


def our_side(case: Case, x: dict[str, torch.Tensor]) -> dict:
    """Our loss and its gradient w.r.t. the current log-probs."""
    current = x["current"].clone().requires_grad_(True)
    settings = LossSettings(**{**dict(kl_coef=KL_COEF, kl_estimator="k3", tis_cap=None), **case.ours})
    behavior = x["engine"] if settings.tis_cap is not None else None
    old = current.detach() if case.on_policy else x["old"]
    out = grpo_loss(
        current, old, x["advantages"], x["mask"], ref_logprobs=x["ref"], behavior_logprobs=behavior, settings=settings
    )
    out.loss.backward()
    result = dict(loss=out.loss.detach(), grad=current.grad, diag=out.diagnostics())
    if case.kl_times_ratio:  # TRL's use_bias_correction_kl: per-token KL times the differentiable ratio pi / pi_old
        again = x["current"].clone().requires_grad_(True)
        old = again.detach() if case.on_policy else x["old"]
        extra = KL_COEF * aggregate(
            kl_estimate(again, x["ref"], "k3") * (torch.exp(again - old) - 1.0),
            x["mask"],
            settings.aggregation,
            settings.max_tokens,
        )
        extra.backward()
        result.update(loss_weighted=result["loss"] + extra.detach(), grad_weighted=current.grad + again.grad)
    return result


def cases() -> list[Case]:
    lo, hi = SURROGATE_EPS
    glo, ghi = GSPO_EPS
    grpo = dict(loss_type="grpo", clip_eps_low=lo, clip_eps_high=hi)
    gspo = dict(loss_type="gspo", clip_eps_low=glo, clip_eps_high=ghi)
    no_bias_kl = dict(use_bias_correction_kl=False)
    surrogate = dict(epsilon=lo, epsilon_high=hi, **no_bias_kl)
    seq = dict(importance_sampling_level="sequence", epsilon=glo, epsilon_high=ghi, **no_bias_kl)

    def engine(mode: str, cap: float, low: float | None) -> tuple[dict, dict]:
        trl = dict(
            use_vllm=True,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode=mode,
            vllm_importance_sampling_clip_max=cap,
            vllm_importance_sampling_clip_min=low,
        )
        return trl, dict(tis_cap=cap, engine_correction=mode, engine_correction_min=low)

    out = [
        Case("grpo (control)", dict(loss_type="dapo", **surrogate), dict(aggregation="token_mean", **grpo)),
        Case(
            "grpo, on-policy (control)",
            dict(loss_type="dapo", **surrogate),
            dict(aggregation="token_mean", **grpo),
            on_policy=True,
        ),
        Case(
            "grpo, per-answer mean",
            dict(loss_type="grpo", **surrogate),
            dict(aggregation="seq_mean_token_mean", **grpo),
        ),
        Case(
            "grpo, Dr. GRPO norm",
            dict(loss_type="dr_grpo", **surrogate),
            dict(aggregation="seq_mean_token_sum_norm", max_tokens=T_MAX, **grpo),
        ),
        Case(
            "gspo",
            dict(loss_type="grpo", **seq),
            dict(aggregation="seq_mean_token_mean", **gspo),
            note="the paper's aggregation",
        ),
        Case(
            "gspo, token mean",
            dict(loss_type="dapo", **seq),
            dict(aggregation="token_mean", **gspo),
            note="TRL's default loss_type",
        ),
        Case(
            "gspo_token",
            dict(loss_type="grpo", **seq),
            dict(aggregation="seq_mean_token_mean", loss_type="gspo_token", clip_eps_low=glo, clip_eps_high=ghi),
            note="vs TRL's GSPO: 1.16 has no sequence_token",
        ),
        Case(
            "cispo",
            dict(loss_type="cispo", epsilon_high=5.0, **no_bias_kl),
            dict(aggregation="token_mean", loss_type="cispo", cispo_ratio_max=5.0),
        ),
        Case(
            "cispo, lower cap",
            dict(loss_type="cispo", epsilon_high=2.0, **no_bias_kl),
            dict(aggregation="token_mean", loss_type="cispo", cispo_ratio_max=2.0),
        ),
    ]
    for mode, cap, low in [
        ("token_truncate", 2.0, None),
        ("token_mask", 2.0, None),
        ("sequence_truncate", 3.0, None),
        ("sequence_mask", 3.0, None),
        ("token_mask", 2.0, 0.5),
        ("sequence_truncate", 3.0, 0.5),
    ]:
        trl, ours = engine(mode, cap, low)
        name = f"grpo + {mode}" + (", lower bound" if low is not None else "")
        out.append(
            Case(name, dict(loss_type="dapo", **surrogate, **trl), dict(aggregation="token_mean", **grpo, **ours))
        )
    trl, ours = engine("sequence_mask", 3.0, None)
    out.append(
        Case(
            "gspo + sequence_mask",
            dict(loss_type="grpo", **seq, **trl),
            dict(aggregation="seq_mean_token_mean", **gspo, **ours),
            note="TRL's default engine mode",
        )
    )
    sapo = dict(aggregation="seq_mean_token_mean", loss_type="sapo")
    out += [
        Case("sapo", dict(loss_type="sapo", **no_bias_kl), dict(**sapo), note="TRL's temperatures 1.0 / 1.05"),
        Case(
            "sapo, other temperatures",
            dict(loss_type="sapo", sapo_temperature_pos=3.0, sapo_temperature_neg=0.5, **no_bias_kl),
            dict(sapo_temperature_pos=3.0, sapo_temperature_neg=0.5, **sapo),
        ),
        Case("sapo, on-policy", dict(loss_type="sapo", **no_bias_kl), dict(**sapo), on_policy=True),
        Case(
            "gmpo",
            dict(loss_type="grpo", epsilon=0.4, **no_bias_kl),
            dict(aggregation="seq_mean_token_mean", loss_type="gmpo", gmpo_clip_eps=0.4),
            trainer="gmpo",
            note="trl.experimental.gmpo, the paper's range",
        ),
        Case(
            "gmpo, eps 0.1",
            dict(loss_type="grpo", epsilon=0.1, **no_bias_kl),
            dict(aggregation="seq_mean_token_mean", loss_type="gmpo", gmpo_clip_eps=0.1),
            trainer="gmpo",
        ),
    ]
    trl, ours = engine("token_mask", 5.0, 0.5)
    ours.update(engine_correction="token_band_mask", engine_correction_max=5.0)
    out.append(
        Case(
            "grpo + token_band_mask",
            dict(loss_type="dapo", **surrogate, **trl),
            dict(aggregation="token_mean", **grpo, **ours),
            note="IcePop's band, vs TRL's token_mask",
        )
    )
    trl, ours = engine("token_truncate", 2.0, None)
    out.append(Case("sapo + token_truncate", dict(loss_type="sapo", **no_bias_kl, **trl), dict(**sapo, **ours)))
    trl, ours = engine("token_truncate", 2.0, None)
    out.append(
        Case(
            "cispo + token_truncate",
            dict(loss_type="cispo", epsilon_high=5.0, **no_bias_kl, **trl),
            dict(aggregation="token_mean", loss_type="cispo", cispo_ratio_max=5.0, **ours),
        )
    )
    out.append(
        Case(
            "grpo, TRL's default KL",
            dict(loss_type="dapo", epsilon=lo, epsilon_high=hi),
            dict(aggregation="token_mean", **grpo),
            expect_equal=False,
            kl_times_ratio=True,
            note="TRL multiplies the KL by the policy ratio",
        )
    )
    out.append(
        Case(
            "grpo, TRL's default KL, on-policy",
            dict(loss_type="dapo", epsilon=lo, epsilon_high=hi),
            dict(aggregation="token_mean", **grpo),
            expect_equal=False,
            on_policy=True,
            kl_times_ratio=True,
            note="ratio 1, its gradient not 0",
        )
    )
    return out


def bounds_text(low: float | None, high: float) -> str:
    return f"[{low}, {high}]" if low is not None else f"max {high}"


def trl_text(c: dict) -> str:
    """TRL's settings, short (beta=0.04 and use_bias_correction_kl=False unless said)."""
    parts = [f"loss_type={c['loss_type']}"]
    if c.get("importance_sampling_level"):
        parts.append(f"level={c['importance_sampling_level']}")
    if c["loss_type"] == "cispo":
        parts.append(f"epsilon_high={c['epsilon_high']}")
    elif c["loss_type"] == "sapo":
        parts.append(f"temperatures {c.get('sapo_temperature_pos', 1.0):g}/{c.get('sapo_temperature_neg', 1.05):g}")
    elif "epsilon_high" in c:
        parts.append(f"epsilon={c['epsilon']:g}/{c['epsilon_high']:g}")
    else:
        parts.append(f"epsilon={c['epsilon']:g}")
    if c.get("use_vllm"):
        bounds = bounds_text(c["vllm_importance_sampling_clip_min"], c["vllm_importance_sampling_clip_max"])
        parts.append(f"IS {c['vllm_importance_sampling_mode']} {bounds}")
    if c.get("use_bias_correction_kl", True):
        parts.append("use_bias_correction_kl=True")
    return ", ".join(parts)


def our_text(c: dict) -> str:
    """Our ``grpo_loss`` arguments, short (kl_coef=0.04, k3)."""
    parts = [c["loss_type"], c["aggregation"] + (f"({c['max_tokens']})" if c.get("max_tokens") else "")]
    if c["loss_type"] == "cispo":
        parts.append(f"cispo_ratio_max={c['cispo_ratio_max']}")
    elif c["loss_type"] == "sapo":
        parts.append(f"temperatures {c.get('sapo_temperature_pos', 1.0):g}/{c.get('sapo_temperature_neg', 1.05):g}")
    elif c["loss_type"] == "gmpo":
        parts.append(f"gmpo_clip_eps={c['gmpo_clip_eps']:g}")
    else:
        parts.append(f"clip_eps={c['clip_eps_low']:g}/{c['clip_eps_high']:g}")
    if c.get("tis_cap") is not None:
        high = c.get("engine_correction_max") or c["tis_cap"]
        parts.append(f"engine {c['engine_correction']} {bounds_text(c.get('engine_correction_min'), high)}")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "trl_objectives.json")
    parser.add_argument("--tol", type=float, default=1e-6, help="largest difference counted as equal (fp32)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()

    import accelerate
    import transformers
    import trl

    is_block = trl_importance_ratio_block()
    x = make_inputs(args.seed)
    B, T = x["mask"].shape
    maskf = x["mask"].float()
    n_tok = int(maskf.sum())
    print(
        f"trl {trl.__version__} | transformers {transformers.__version__} | accelerate {accelerate.__version__} | "
        f"torch {torch.__version__}"
    )
    on = x["mask"].bool()
    far_old = float(((x["current"] - x["old"]).abs() > 0.5)[on].float().mean())
    far_engine = float(((x["old"] - x["engine"]).abs() > math.log(2))[on].float().mean())
    print(
        f"batch: {B} answers ({GROUPS} groups x {GROUP_SIZE}) of {int(x['lengths'].min())}-{int(x['lengths'].max())} "
        f"tokens, {n_tok} in all; |log pi - log pi_old| > 0.5 on {far_old:.1%} of them, "
        f"|log pi_old - log mu| > log 2 on {far_engine:.1%}"
    )

    rows = []
    for case in cases():
        trl_out = trl_side(case, x, is_block)
        ours = our_side(case, x)
        loss_diff = float((trl_out["loss"] - ours["loss"]).abs())
        grad_diff = float((trl_out["grad"] - ours["grad"]).abs().max())
        d = ours["diag"]
        trl_clip = trl_out["metrics"].get("clip_ratio/region_mean", trl_out["metrics"].get("cispo_clip_ratio"))
        trl_clip_text = f"TRL's metric {trl_clip:.1%}" if trl_clip is not None else "TRL logs none"
        acted = [f"clip {d['clip_fraction']:.1%} ({trl_clip_text})"]
        if case.ours.get("tis_cap") is not None:
            bounded = d["tis_fraction"]
            r = trl_out["ratio"].expand(B, T)
            raw = (
                torch.exp(x["old"] - x["engine"])
                if case.ours["engine_correction"].startswith("token")
                else torch.exp(((x["old"] - x["engine"]) * maskf).sum(-1, keepdim=True)).expand(B, T)
            )
            trl_changed = float(((r != raw).float() * maskf).sum() / n_tok)
            acted.append(f"engine weight bounded {bounded:.1%} (TRL {trl_changed:.1%})")
        equal = loss_diff <= args.tol and grad_diff <= args.tol
        explained = {}
        if case.kl_times_ratio:
            explained = dict(
                loss_diff=float((trl_out["loss"] - ours["loss_weighted"]).abs()),
                grad_diff=float((trl_out["grad"] - ours["grad_weighted"]).abs().max()),
            )
            acted.append(
                f"with KL x ratio added to ours: diffs {explained['loss_diff']:.1e} / {explained['grad_diff']:.1e}"
            )
        as_expected = equal == case.expect_equal and all(v <= args.tol for v in explained.values())
        row = dict(
            case=case.name,
            trl=trl_text(case.trl),
            ours=our_text(case.ours),
            note=case.note,
            loss_trl=float(trl_out["loss"]),
            loss_ours=float(ours["loss"]),
            loss_diff=loss_diff,
            grad_diff=grad_diff,
            grad_max=float(ours["grad"].abs().max()),
            acted="; ".join(acted),
            trl_clip_metric=trl_clip,
            equal=equal,
            expect_equal=case.expect_equal,
            as_expected=as_expected,
            with_kl_times_ratio=explained,
            diagnostics={k: d[k] for k in ("clip_fraction", "tis_fraction", "engine_masked_fraction")},
        )
        rows.append(row)

    print()
    print(
        "| case | TRL settings | our settings | acted on (tokens) | loss | \\|loss diff\\| "
        "| max \\|grad diff\\| (max \\|grad\\|) |"
    )
    print("|---|---|---|---|---:|---:|---:|")
    for r in rows:
        note = f" ({r['note']})" if r["note"] else ""
        print(
            f"| {r['case']}{note} | {r['trl']} | {r['ours']} | {r['acted']} | {r['loss_ours']:.6f} | "
            f"{r['loss_diff']:.1e} | {r['grad_diff']:.1e} ({r['grad_max']:.1e}) |"
        )
    unexpected = [r["case"] for r in rows if not r["as_expected"]]
    n_equal = sum(r["equal"] for r in rows)
    print(
        f"\n{n_equal} of {len(rows)} cases equal within {args.tol:g}; the others differ by TRL's KL x ratio alone"
        + (f"; NOT AS EXPECTED: {unexpected}" if unexpected else "")
    )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = dict(
        versions=dict(trl=trl.__version__, transformers=transformers.__version__, torch=torch.__version__),
        seed=args.seed,
        tokens=n_tok,
        answers=B,
        kl_coef=KL_COEF,
        tol=args.tol,
        rows=rows,
        unexpected=unexpected,
        seconds=round(time.perf_counter() - t0, 1),
    )
    args.out.write_text(json.dumps(result, indent=1))
    print(f"written {args.out} ({result['seconds']} s)")
    sys.exit(1 if unexpected else 0)


if __name__ == "__main__":
    main()
