"""The GRPO objective: a KL-penalised policy-gradient loss over response tokens.

Implements the policy loss of GRPO (Shao et al., 2024, "DeepSeekMath", eq. 3) with the refinements that
later work found to matter, each selectable by an explicit argument:

* The policy term (:mod:`grpo_rl.algo.objectives`): GRPO's clipped surrogate (the default), GSPO's sequence-level
  ratio and its GSPO-token variant (Zheng et al., 2025), CISPO's clipped, stop-gradient weight (MiniMax-M1), SAPO's
  soft gate (Qwen, 2025) or GMPO's geometric mean of token-clipped ratios (Zhao et al., 2025).
* Separate low/high clip ranges ("clip-higher", DAPO, Yu et al., 2025): the ratio is clipped to
  ``[1 - eps_low, 1 + eps_high]``.
* Aggregation over tokens:
    - ``"seq_mean_token_mean"``: mean over sequences of per-sequence token means (original GRPO);
    - ``"token_mean"``: mean over all response tokens of the batch (DAPO);
    - ``"seq_mean_token_sum_norm"``: token sum divided by a constant ``max_tokens`` and averaged over
      sequences (Dr. GRPO, Liu et al., 2025), which removes the length bias of per-sequence means.
* KL to the reference policy with the k1, k2 or k3 estimator (Schulman, 2020, "Approximating KL
  divergence"). GRPO uses k3 in the loss. When the KL is applied in the reward instead
  (:func:`kl_penalised_rewards`), ``kl_coef`` here is 0.
* An importance weight between the policy the learner evaluates at (``old_logprobs``) and the engine that
  sampled (``behavior_logprobs``), truncated at ``tis_cap`` per token by default (Yao et al., 2025, "truncated
  importance sampling"), or masked, or per answer, or masked outside IcePop's two-sided band
  (:mod:`grpo_rl.algo.engine_correction`); it corrects engine/learner numeric mismatch and, in the asynchronous
  loop, policy lag.
* An optional entropy bonus, ``-entropy_coef`` times the aggregated token entropy (needs an entropy computed
  with gradient).
* Under sampling truncation (top-k / top-p) the policy's log-probs are those of the truncated distribution
  (:mod:`grpo_rl.model.vocab`); a sampled token outside the policy's own truncated set has no finite log-prob, so its
  policy and KL terms get weight 0 (``outside``), keeping its place in the denominators as a masked engine weight
  does, and the fraction is reported as ``truncation_masked_fraction``.

Departures from the paper and from TRL:

* The KL term and the entropy bonus are aggregated with the same rule as the policy term, so all three see the
  same token weighting (TRL aggregates its entropy bonus as a token mean whatever the loss type); this also
  keeps the learner's micro-batch shares exact for every term.
* The k3 estimate clamps ``log pi_ref - log pi`` at 20 before the exponential (TRL does not clamp). Only tokens
  to which the reference gives more than e^20 (about 5e8) times the policy's probability are affected: their
  ``exp`` would reach ~1e38 and overflow float32 near a difference of 88.7, turning the whole step non-finite
  (and skipped). Clamped, such a token adds the constant ``e^20 - 21`` and no gradient, so one pathological
  token can neither make the step non-finite nor dominate the KL gradient.
* The KL term is GRPO's plain k3 per token. TRL 1.16 by default (``use_bias_correction_kl=True``) multiplies each
  token's k3 by the ratio ``pi / pi_old``, which carries a gradient: the losses agree on-policy, the KL gradients
  do not (adding ``kl_coef * aggregate(k3 * (ratio - 1))`` here reproduces TRL's to 1e-9;
  ``benchmarks/versus_trl/trl_objectives.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from grpo_rl.algo.engine_correction import EngineCorrection, EngineWeights, engine_weights, weight_quantiles
from grpo_rl.algo.objectives import PolicyObjective, PolicyTerm, policy_term

# The config package needs Hydra; the loss itself needs only torch (benchmarks/versus_trl/trl_objectives.py).
if TYPE_CHECKING:
    from grpo_rl.config.schema import PolicyConfig, SamplingConfig

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


@dataclass(frozen=True)
class LossSettings:
    """The loss's scalars, resolved once from ``policy`` and ``sampling``; the learner also reads the sampling
    fields (``temperature``, ``top_p``, ``top_k``) to take log-probs under the engine's distribution.

    Attributes:
        loss_type: the policy term, ``grpo``, ``gspo``, ``gspo_token``, ``cispo``, ``sapo`` or ``gmpo``
            (:mod:`grpo_rl.algo.objectives`; aliases such as ``dapo`` are resolved by
            :func:`~grpo_rl.config.checks.resolve_loss_type`).
        clip_eps_low, clip_eps_high: the surrogates' ratio is clipped to ``[1 - clip_eps_low, 1 + clip_eps_high]``.
        cispo_ratio_max, cispo_ratio_min: bounds of CISPO's stop-gradient weight (``None``: no lower bound).
        sapo_temperature_pos, sapo_temperature_neg: SAPO's gate temperatures for positive and other advantages.
        gmpo_clip_eps: GMPO's token log-ratios are clipped to ``[-gmpo_clip_eps, gmpo_clip_eps]``.
        kl_coef: weight of the KL term (0 disables it; 0 too when the KL is in the reward).
        kl_estimator: ``k1``, ``k2`` or ``k3``.
        aggregation: token aggregation, see the module docstring.
        max_tokens: normaliser for ``seq_mean_token_sum_norm`` (``sampling.max_new_tokens``).
        tis_cap: upper bound of the engine importance weight in the truncate and mask modes; ``None`` disables
            the correction, in every mode.
        engine_correction: ``token_truncate``, ``token_mask``, ``sequence_truncate``, ``sequence_mask``,
            ``token_band_mask`` or ``sequence_band_mask``.
        engine_correction_min: lower bound of the engine weight; ``None`` for none (the band modes need one).
        engine_correction_max: upper bound of the band modes' weight (IcePop's ``beta``); unused by the others.
        entropy_coef: weight of the entropy bonus ``-entropy_coef * aggregate(entropy)`` (0 disables it).
        temperature, top_p, top_k: the engine's sampling distribution, which the policy's log-probs are taken under
            (:mod:`grpo_rl.model.vocab`); tokens outside its truncated set get weight 0 in the loss.
    """

    loss_type: PolicyObjective = "grpo"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    cispo_ratio_max: float = 5.0
    cispo_ratio_min: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    gmpo_clip_eps: float = 0.4
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    aggregation: Aggregation = "token_mean"
    max_tokens: int | None = None
    tis_cap: float | None = 2.0
    engine_correction: EngineCorrection = "token_truncate"
    engine_correction_min: float | None = None
    engine_correction_max: float | None = None
    entropy_coef: float = 0.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @classmethod
    def from_config(cls, policy: PolicyConfig, sampling: SamplingConfig) -> LossSettings:
        """The settings ``policy`` and ``sampling`` name, the loss type's alias resolved."""
        from grpo_rl.config.checks import resolve_loss_type

        objective, aggregation = resolve_loss_type(policy.loss_type, policy.aggregation)
        return cls(
            loss_type=objective,
            clip_eps_low=policy.clip_eps_low,
            clip_eps_high=policy.clip_eps_high,
            cispo_ratio_max=policy.cispo_ratio_max,
            cispo_ratio_min=policy.cispo_ratio_min,
            sapo_temperature_pos=policy.sapo_temperature_pos,
            sapo_temperature_neg=policy.sapo_temperature_neg,
            gmpo_clip_eps=policy.gmpo_clip_eps,
            kl_coef=0.0 if policy.kl_in_reward else policy.kl_coef,  # a KL in the reward is not in the loss too
            kl_estimator=policy.kl_estimator,
            aggregation=aggregation,
            max_tokens=sampling.max_new_tokens,
            tis_cap=policy.tis_cap,
            engine_correction=policy.engine_correction,
            engine_correction_min=policy.engine_correction_min,
            engine_correction_max=policy.engine_correction_max,
            entropy_coef=policy.entropy_coef,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
        )

    def engine_weights(
        self, old_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> EngineWeights | None:
        """The engine correction's weights and cut tokens for ``[B, T]`` log-probs (None when ``tis_cap`` is None)."""
        if self.tis_cap is None:
            return None
        return engine_weights(
            old_logprobs,
            behavior_logprobs,
            mask,
            mode=self.engine_correction,
            cap=self.tis_cap,
            min_weight=self.engine_correction_min,
            max_weight=self.engine_correction_max,
        )


@dataclass
class GRPOLossOutput:
    """Named loss terms (differentiable) and detached scalar diagnostics.

    ``loss`` is ``loss_policy + loss_kl`` (``+ loss_entropy`` when ``entropy_coef > 0``). The engine-weight
    quantiles are over this call's tokens (or answers, at the sequence level); the learner averages them over
    micro-batches.
    """

    loss: torch.Tensor
    loss_policy: torch.Tensor
    loss_kl: torch.Tensor
    loss_entropy: torch.Tensor  # -entropy_coef * aggregated entropy; 0 when the bonus is off
    clip_fraction: torch.Tensor  # fraction of tokens whose ratio was clipped
    kl_approx: torch.Tensor  # k3 estimate of KL(old || new), for monitoring the step size
    kl_ref: torch.Tensor  # mean chosen-estimator KL to the reference, per token
    ratio_mean: torch.Tensor  # mean of the objective's ratio (the sequence ratio for gspo, gspo_token, gmpo)
    ess: torch.Tensor  # normalised effective sample size of the importance weights, in (0, 1]
    tis_fraction: torch.Tensor  # fraction of tokens whose engine weight was outside its bounds (truncated or masked)
    engine_masked_fraction: torch.Tensor  # fraction of tokens whose engine weight was set to 0 (mask and band modes)
    engine_weight_p5: torch.Tensor  # quantiles of the unbounded engine weight pi_old / mu (1 without behavior_logprobs)
    engine_weight_p50: torch.Tensor
    engine_weight_p95: torch.Tensor
    kl_engine: torch.Tensor  # k3 estimate of KL(engine || learner's old policy) on the engine's samples, per token
    truncation_masked_fraction: torch.Tensor  # fraction of tokens outside the policy's truncated set (weight 0)
    entropy: torch.Tensor | None = None

    def diagnostics(self) -> dict[str, float]:
        """All scalar fields as floats, for logging."""
        out = {k: float(v.detach()) for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return out


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate ``[B, T]`` of KL(pi || pi_ref) from samples of pi, ``logprobs`` and ``ref_logprobs``
    ``[B, T]``: with ``log r = logprobs - ref_logprobs``, ``k1 = log r``, ``k2 = (log r)^2 / 2``,
    ``k3 = exp(-log r) - 1 + log r``."""
    log_ratio = logprobs - ref_logprobs  # [B, T]
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        # Clamp before exp: where the reference gives a token far more probability than the policy
        # (ref_logprobs - logprobs > 20), exp would overflow; see the module docstring.
        neg = (-log_ratio).clamp(max=20.0)
        return torch.exp(neg) - 1.0 - neg
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of 'k1', 'k2', 'k3'")


def aggregate(
    values_BT: torch.Tensor, mask_BT: torch.Tensor, mode: Aggregation, max_tokens: int | None
) -> torch.Tensor:
    """Reduce per-token ``values_BT`` over the response tokens of ``mask_BT`` (``[B, T]``) to a scalar with the
    ``mode`` of the module docstring; ``max_tokens`` is ``seq_mean_token_sum_norm``'s constant normaliser."""
    mask_BT = mask_BT.to(values_BT.dtype)
    masked = values_BT * mask_BT
    if mode == "token_mean":
        return masked.sum() / mask_BT.sum().clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(-1) / mask_BT.sum(-1).clamp(min=1.0)  # [B]
        return per_seq.mean()
    if mode == "seq_mean_token_sum_norm":
        if not max_tokens or max_tokens <= 0:
            raise ValueError("aggregation 'seq_mean_token_sum_norm' needs a positive max_tokens")
        return (masked.sum(-1) / float(max_tokens)).mean()  # a constant, so no length bias (Dr. GRPO)
    raise ValueError(
        f"unknown aggregation {mode!r}; choose 'token_mean', 'seq_mean_token_mean' or 'seq_mean_token_sum_norm'"
    )


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,
    behavior_logprobs: torch.Tensor | None = None,
    settings: LossSettings = LossSettings(),
    entropy: torch.Tensor | None = None,
    scale: float = 1.0,
    outside: torch.Tensor | None = None,
) -> GRPOLossOutput:
    """Policy-gradient loss (clipped surrogate by default) with an optional KL penalty and entropy bonus.

    Args:
        logprobs: log-probs of the sampled tokens under the policy being trained, ``[B, T]``.
        old_logprobs: the same under the policy at the start of this update (detached), ``[B, T]``;
            ``logprobs.detach()`` when each batch makes one optimizer step.
        advantages: one advantage per sequence ``[B]`` or per token ``[B, T]``.
        mask: response-token mask, ``[B, T]``.
        ref_logprobs: reference-policy log-probs, ``[B, T]``; required when ``kl_coef > 0``.
        behavior_logprobs: log-probs recorded by the sampling engine, ``[B, T]``; enables the engine importance
            weight ``exp(old - behavior)`` (:mod:`grpo_rl.algo.engine_correction`).
        settings: the scalars; its sampling fields are not used here.
        entropy: per-token entropy ``[B, T]``; reported as a diagnostic, and with ``entropy_coef > 0`` rewarded,
            in which case it must carry a gradient.
        scale: multiplies the loss terms, e.g. a micro-batch's share of the gradient-accumulation step.
        outside: bool ``[B, T]``, tokens outside the policy's truncated sampling set (their log-probs are
            stand-ins, :mod:`grpo_rl.model.vocab`): weight 0 in the policy and KL terms, the engine weights and the
            ratio diagnostics; still counted in the aggregation's denominators. None: no truncation.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have the same [B, T] shape"
        )
    mask_f = mask.to(logprobs.dtype)  # [B, T]
    # The tokens whose log-probs are real: all of the mask unless some lie outside the truncated set.
    keep_f = mask_f if outside is None else mask_f * (~outside.bool()).to(mask_f.dtype)  # [B, T]
    adv_BT = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
    adv_BT = adv_BT.to(logprobs.dtype)

    term = policy_term(
        logprobs,
        old_logprobs,
        adv_BT,
        keep_f,
        objective=settings.loss_type,
        clip_eps_low=settings.clip_eps_low,
        clip_eps_high=settings.clip_eps_high,
        cispo_ratio_max=settings.cispo_ratio_max,
        cispo_ratio_min=settings.cispo_ratio_min,
        sapo_temperature_pos=settings.sapo_temperature_pos,
        sapo_temperature_neg=settings.sapo_temperature_neg,
        gmpo_clip_eps=settings.gmpo_clip_eps,
    )
    pg_loss_BT = term.loss_BT  # [B, T]
    if outside is not None:
        pg_loss_BT = pg_loss_BT * keep_f  # their log-probs are stand-ins

    engine = None if behavior_logprobs is None else settings.engine_weights(old_logprobs, behavior_logprobs, keep_f)
    if engine is not None:
        pg_loss_BT = pg_loss_BT * engine.weight_BT

    # mask_f, not keep_f: a token given weight 0 keeps its place in the denominators.
    loss_policy = aggregate(pg_loss_BT, mask_f, settings.aggregation, settings.max_tokens) * scale

    kl_BT = None
    if settings.kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (enable the reference model or set kl_coef=0)")
        kl_BT = kl_estimate(logprobs, ref_logprobs.detach(), settings.kl_estimator)  # [B, T]
        if outside is not None:
            kl_BT = kl_BT * keep_f
        loss_kl = settings.kl_coef * aggregate(kl_BT, mask_f, settings.aggregation, settings.max_tokens) * scale
    else:
        loss_kl = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)

    loss = loss_policy + loss_kl
    if settings.entropy_coef > 0.0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropy (sequence_logprobs(..., with_entropy=True))")
        if logprobs.requires_grad and not entropy.requires_grad:
            raise ValueError(
                "entropy_coef > 0 needs an entropy with gradient (sequence_logprobs(..., "
                "entropy_grad=True)); this one is detached, so the bonus would train nothing"
            )
        loss_entropy = (
            -settings.entropy_coef * aggregate(entropy, mask_f, settings.aggregation, settings.max_tokens) * scale
        )
        loss = loss + loss_entropy
    else:
        loss_entropy = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)

    diagnostics = loss_diagnostics(
        logprobs,
        old_logprobs,
        mask_f,
        keep_f,
        term,
        engine,
        kl_BT=kl_BT,
        ref_logprobs=ref_logprobs,
        kl_estimator=settings.kl_estimator,
        behavior_logprobs=behavior_logprobs,
        entropy=entropy,
    )
    return GRPOLossOutput(
        loss=loss, loss_policy=loss_policy, loss_kl=loss_kl, loss_entropy=loss_entropy, **vars(diagnostics)
    )


@dataclass
class LossDiagnostics:
    """The detached diagnostics of :class:`GRPOLossOutput`, its fields of the same names."""

    clip_fraction: torch.Tensor
    kl_approx: torch.Tensor
    kl_ref: torch.Tensor
    ratio_mean: torch.Tensor
    ess: torch.Tensor
    tis_fraction: torch.Tensor
    engine_masked_fraction: torch.Tensor
    engine_weight_p5: torch.Tensor
    engine_weight_p50: torch.Tensor
    engine_weight_p95: torch.Tensor
    kl_engine: torch.Tensor
    truncation_masked_fraction: torch.Tensor
    entropy: torch.Tensor | None


@torch.no_grad()
def loss_diagnostics(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask_f: torch.Tensor,
    keep_f: torch.Tensor,
    term: PolicyTerm,
    engine: EngineWeights | None,
    *,
    kl_BT: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    kl_estimator: KLEstimator,
    behavior_logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> LossDiagnostics:
    """The detached diagnostics of one :func:`grpo_loss` call.

    Args:
        mask_f, keep_f: float ``[B, T]``, the response tokens and those of them with real log-probs (inside the
            truncated sampling set).
        term, engine: the policy term and the engine weights (None: no correction) the loss used.
        kl_BT: the loss's per-token KL ``[B, T]``, or None when the loss has no KL term.
    """
    n_tok = mask_f.sum().clamp(min=1.0)
    n_keep = keep_f.sum().clamp(min=1.0)
    if kl_BT is not None:
        kl_ref = (kl_BT.detach() * keep_f).sum() / keep_f.sum().clamp(min=1.0)
    elif ref_logprobs is not None:  # no KL term in the loss, but one worth watching
        kl_BT = kl_estimate(logprobs.detach(), ref_logprobs, kl_estimator)  # [B, T]
        kl_ref = (kl_BT * keep_f).sum() / keep_f.sum().clamp(min=1.0)
    else:
        kl_ref = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    ratio = term.ratio_BT  # [B, T]
    clip_fraction = (term.clipped_BT.to(mask_f.dtype) * keep_f).sum() / n_tok
    log_ratio = logprobs - old_logprobs.detach()  # [B, T]: per token, whatever the objective
    kl_approx = (((torch.exp(log_ratio) - 1.0) - log_ratio) * keep_f).sum() / n_keep
    ratio_mean = (ratio * keep_f).sum() / n_keep
    w = (ratio * engine.weight_BT if engine is not None else ratio) * keep_f
    ess = w.sum().pow(2) / (w.pow(2).sum().clamp(min=1e-12) * n_keep)
    zero = torch.zeros((), dtype=mask_f.dtype, device=mask_f.device)
    tis_fraction = (engine.outside_BT.to(mask_f.dtype) * keep_f).sum() / n_tok if engine is not None else zero
    masked_fraction = (engine.masked_BT.to(mask_f.dtype) * keep_f).sum() / n_tok if engine is not None else zero
    truncation_masked = (mask_f - keep_f).sum() / n_tok
    if behavior_logprobs is not None:
        # Reported even with the correction off: how far the engine drifts is worth watching either way.
        raw = engine.raw if engine is not None else torch.exp(old_logprobs - behavior_logprobs)
        p5, p50, p95 = weight_quantiles(raw, keep_f)
        kl_engine = (kl_estimate(behavior_logprobs, old_logprobs, "k3") * keep_f).sum() / n_keep
    else:
        p5 = p50 = p95 = torch.ones((), dtype=mask_f.dtype, device=mask_f.device)
        kl_engine = zero
    ent = (entropy.detach() * mask_f).sum() / n_tok if entropy is not None else None
    return LossDiagnostics(
        clip_fraction=clip_fraction,
        kl_approx=kl_approx,
        kl_ref=kl_ref,
        ratio_mean=ratio_mean,
        ess=ess,
        tis_fraction=tis_fraction,
        engine_masked_fraction=masked_fraction,
        engine_weight_p5=p5,
        engine_weight_p50=p50,
        engine_weight_p95=p95,
        kl_engine=kl_engine,
        truncation_masked_fraction=truncation_masked,
        entropy=ent,
    )
