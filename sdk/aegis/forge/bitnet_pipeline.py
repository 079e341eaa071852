"""Forge phase 4 end to end: calibrate, (optionally) fine-tune with the straight-through estimator as a
supervised run, revert layers that cost too much, pack, and report against the size category's targets.

    report = compress_calibrated("merged/", "ternary/", data="support.jsonl",
                                 finetune=FinetuneSettings(steps=200), runs_dir="runs")
    report.stages["after_ste"].accuracy, report.compression.total_compression, report.reverted_layers

Steps (the Agent Forge phase-4 procedure, with the BitNet b1.58 papers' quantisers):

1. The model's size is read at run time (:func:`aegis.models.profiles.profile_from_config` on its config.json): the size
   category (:data:`aegis.forge.bitnet.SIZE_CATEGORIES`) gives the calibration sample count, the target
   compression and expected sparsity; the accuracy-drop bars (warning above 5 %, critical above 10 %, relative
   to the full-precision model) are the plan's for every size.
2. Calibration: rows of ``data`` rendered by the project's render layer with the model's own tokenizer and chat
   template (:func:`aegis.train.data.load_examples`); the eval is mean next-token NLL (perplexity) and next-token
   accuracy over the loss-masked tokens (assistant tokens of chats, every token of plain text).
3. Eval of the full-precision model, and of the quantised one (W1.58 A8, :class:`~aegis.forge.bitnet_train.BitNetModel`).
4. With ``finetune``: a supervised run (``RunConfig.quantize``: checkpoints, events, resume after ``kill -9``
   like any run) trains the latent weights through the quantised forward; its export is what gets packed.
5. Layer-wise revert when the quantised model's drop exceeds ``max_drop``: layers are quantised one at a
   time in order, on top of those already accepted; a layer whose quantisation takes the drop over
   ``max_drop`` stays in full precision.
6. Packing (:func:`aegis.forge.bitnet.compress_model`, reverted layers kept), then the packed folder is loaded
   and evaluated from the packed form; ``bitnet_report.json`` in the output folder holds the report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from aegis.errors import InvalidConfigError, RunError
from aegis.forge.bitnet import CompressionResult
from aegis.schema import Frozen

__all__ = [
    "ACCURACY_WARNING",
    "ACCURACY_CRITICAL",
    "CALIBRATION_SAMPLES",
    "EXPECTED_SPARSITY",
    "EvalResult",
    "LayerDecision",
    "FinetuneSettings",
    "BitNetReport",
    "load_calibration",
    "evaluate",
    "relative_drop",
    "layerwise_revert",
    "finetune_ste",
    "compress_calibrated",
]

ACCURACY_WARNING = 0.05
"""The plan's warning bar on the relative accuracy drop (all sizes)."""
ACCURACY_CRITICAL = 0.10
"""The plan's critical bar on the relative accuracy drop (all sizes); the default revert threshold."""
CALIBRATION_SAMPLES = {"tiny": 500, "small": 1000, "medium": 2000, "large": 5000}
"""The plan's calibration sample count per size category."""
EXPECTED_SPARSITY = {"tiny": 0.25, "small": 0.35, "medium": 0.40, "large": 0.45}
"""The plan's expected share of zero weights per size category (reported beside the measured one)."""
REPORT_FILE = "bitnet_report.json"

Metric = Literal["accuracy", "perplexity"]


class EvalResult(Frozen):
    """Next-token eval over the calibration set."""

    nll: float = Field(description="Mean next-token negative log-likelihood (nats) over the target tokens.")
    perplexity: float = Field(description="exp(nll).")
    accuracy: float = Field(description="Share of target tokens whose argmax prediction is the token.")
    tokens: int = Field(description="Target tokens evaluated.")


def relative_drop(base: EvalResult, other: EvalResult, metric: Metric = "accuracy") -> float:
    """The plan's drop: ``(acc_base - acc) / acc_base`` for accuracy; ``ppl / ppl_base - 1`` for perplexity."""
    if metric == "accuracy":
        return (base.accuracy - other.accuracy) / max(base.accuracy, 1e-12)
    return other.perplexity / base.perplexity - 1.0


class LayerDecision(Frozen):
    """One step of the layer-wise revert."""

    layer: int
    drop: float = Field(description="Drop with this layer and every accepted layer before it quantised.")
    reverted: bool = Field(description="The layer stays in full precision.")


class FinetuneSettings(Frozen):
    """The straight-through fine-tuning run (a supervised run with ``quantize: bitnet_b158``)."""

    data: str | None = Field(default=None, description="Training data (default: the calibration data).")
    steps: int = Field(default=200, ge=1, description="Optimizer steps.")
    lr: float = Field(default=1e-3, gt=0, description="Peak learning rate (BitNet recipes use ~1e-3 to 1e-4).")
    micro_batch_size: int | None = Field(
        default=None, ge=1,
        description="Sequences per step (default: the largest power of two up to 8 the planner fits on the device).",
    )
    seq_len: int = Field(default=256, ge=2, description="Tokens per sequence.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear LR warm-up steps.")
    lambda_warmup_steps: int = Field(default=0, ge=0, description="Quantisation warm-up (lambda 0 -> 1) steps.")
    steps_per_window: int = Field(default=50, ge=1, description="Supervisor window (and checkpoint) length.")
    seed: int = Field(default=0)


class BitNetReport(Frozen):
    """What :func:`compress_calibrated` measured and decided."""

    out: Path
    size_category: str
    total_params: int
    calibration_examples: int
    metric: Metric = Field(description="The drop the revert threshold applies to.")
    max_drop: float = Field(description="Revert threshold on the relative drop.")
    stages: dict[str, EvalResult] = Field(
        description="'full_precision', 'quantized' (all layers, before fine-tuning), 'after_ste' (with finetune), "
        "'final' (reverted layers kept, the packed model's forward)."
    )
    drops: dict[str, float] = Field(description="Relative drop of each stage against full precision.")
    perplexity_ratios: dict[str, float] = Field(description="Perplexity of each stage over full precision's.")
    layer_decisions: tuple[LayerDecision, ...] = Field(description="The layer-wise revert, when it ran.")
    reverted_layers: tuple[int, ...]
    run_id: str | None = Field(description="The STE fine-tuning run, when there was one.")
    compression: CompressionResult = Field(description="What the packer wrote and measured.")
    expected_sparsity: float
    accuracy_verdict: Literal["ok", "warning", "critical"] = Field(description="Final drop vs the 5 % / 10 % bars.")
    compression_verdict: Literal["ok", "low"] = Field(description="'low' below 80 % of the target (the plan's check).")

    def summary(self) -> str:
        c = self.compression
        lines = [
            f"BitNet b1.58: {self.total_params:,} params ({self.size_category}), "
            f"{self.calibration_examples} calibration examples",
            f"compression {c.total_compression:.2f}x whole model (target {c.target_compression:.1f}x: "
            f"{self.compression_verdict}), {c.linear_compression:.2f}x ternary weights; sparsity {c.sparsity:.1%} "
            f"(plan expects ~{self.expected_sparsity:.0%})",
        ]
        for k, e in self.stages.items():
            lines.append(f"  {k:<15} acc {e.accuracy:.4f}  ppl {e.perplexity:9.3f}  drop {self.drops[k]:+.1%}")
        if self.layer_decisions:
            lines.append("  revert: " + ", ".join(
                f"layer {d.layer} {'kept' if d.reverted else 'ternary'} ({d.drop:+.1%})" for d in self.layer_decisions
            ))
        lines.append(f"accuracy drop {self.drops['final']:.1%}: {self.accuracy_verdict}")
        return "\n".join(lines)


# ----- calibration and eval ---------------------------------------------------------------------------------


def load_calibration(
    model_folder: str | Path, data: str, *, samples: int, seq_len: int = 256, chat_template: str | None = None
) -> list[Any]:
    """The first ``samples`` rows of ``data`` rendered with the model's own tokenizer and template."""
    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples

    renderer = ChatRenderer.from_folder(model_folder, chat_template=chat_template)
    examples, _ = load_examples(data, renderer, seq_len=seq_len)
    return examples[:samples]


def _eval_batches(examples: Sequence[Any], batch_size: int, seq_len: int) -> list[dict[str, Any]]:
    from aegis.train.data import iter_batches

    return [b.arrays() for b in iter_batches(examples, batch_size, seq_len, packing=False)]


def evaluate(
    forward: Callable[[Any], Any], batches: Sequence[dict[str, Any]]
) -> EvalResult:
    """Eval of ``forward(batch) -> logits [b, s, vocab]`` over host batches (``iter_batches`` arrays)."""
    import math

    import numpy as np

    nll = correct = count = 0.0
    for b in batches:
        logits = np.asarray(forward(b), np.float64)
        mask = b["loss_mask"] > 0
        t = b["targets"]
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        tgt = np.take_along_axis(logits, t[..., None], -1)[..., 0]
        nll += float(((logz - tgt) * mask).sum())
        correct += float(((logits.argmax(-1) == t) & mask).sum())
        count += float(mask.sum())
    if count == 0:
        raise InvalidConfigError("the calibration set has no target tokens; give data with text or assistant turns")
    mean = nll / count
    return EvalResult(nll=mean, perplexity=math.exp(mean), accuracy=correct / count, tokens=int(count))


class _Evaluator:
    """One jitted forward per model, the per-layer strengths an argument (the revert does not recompile)."""

    def __init__(self, model: Any, per_channel: bool, activations: bool, batches: list[dict[str, Any]]) -> None:
        import dataclasses

        import jax

        from aegis.forge.bitnet_train import BitNetModel

        self.model = model
        self.batches = batches
        self.n = model.spec.num_layers
        bm = BitNetModel(model, per_channel=per_channel, activations=activations)

        def fwd(params: Any, strength: Any, b: dict[str, Any]) -> Any:
            m = dataclasses.replace(bm, layer_strength=strength)
            return m.apply(params, b["input_ids"], positions=b["positions"], segment_ids=b["segment_ids"])

        self._q = jax.jit(fwd)
        self._fp = jax.jit(
            lambda p, b: model.apply(p, b["input_ids"], positions=b["positions"], segment_ids=b["segment_ids"])
        )

    def full_precision(self, params: Any) -> EvalResult:
        return evaluate(lambda b: self._fp(params, b), self.batches)

    def quantized(self, params: Any, keep: Sequence[int] = ()) -> EvalResult:
        import numpy as np

        strength = np.ones(self.n, np.float32)
        strength[list(keep)] = 0.0
        return evaluate(lambda b: self._q(params, strength, b), self.batches)


def layerwise_revert(
    quantized: Callable[[Sequence[int]], EvalResult],
    base: EvalResult,
    num_layers: int,
    *,
    max_drop: float,
    metric: Metric = "accuracy",
) -> tuple[tuple[int, ...], list[LayerDecision]]:
    """The plan's staged quantisation: layers in order, each quantised on top of the accepted ones
    (``quantized(keep)`` evaluates the model with the layers in ``keep`` in full precision); a layer whose
    drop exceeds ``max_drop`` is reverted. Returns ``(kept layers, decisions)``."""
    keep = set(range(num_layers))
    decisions = []
    for i in range(num_layers):
        trial = keep - {i}
        drop = relative_drop(base, quantized(sorted(trial)), metric)
        reverted = drop > max_drop
        if not reverted:
            keep = trial
        decisions.append(LayerDecision(layer=i, drop=drop, reverted=reverted))
    return tuple(sorted(keep)), decisions


# ----- the STE run -------------------------------------------------------------------------------------------


def finetune_ste(
    src: str | Path,
    data: str,
    settings: FinetuneSettings,
    *,
    runs_dir: str | Path,
    per_channel: bool = False,
    run_id: str | None = None,
) -> tuple[str, Path]:
    """Quantisation-aware fine-tuning of model folder ``src`` as a supervised run; ``(run_id, export folder)``
    (full-precision latent weights, an HF folder). A run that pauses for a human raises :class:`RunError`
    naming how to continue it."""
    from aegis.schema import TrainConfig
    from aegis.supervise.run_config import QuantizeSection, RunConfig, TrainingSection
    from aegis.supervise.runner import Supervisor
    from aegis.supervise.runs import RunPaths

    micro_batch = settings.micro_batch_size
    if micro_batch is None:  # model-size-agnostic: the planner sizes the STE run for this model and device
        from aegis.forge._evo_fitness import plan_train_batch
        from aegis.models.source import locate_model

        micro_batch = plan_train_batch(locate_model(str(src)).config(), settings.seq_len, cap=8)
    cfg = RunConfig(
        run_id=run_id,
        model=str(src),
        data=data,
        init="pretrained",
        train_config=TrainConfig(
            method="full", micro_batch_size=micro_batch, seq_len=settings.seq_len, precision="fp32"
        ),
        training=TrainingSection(
            steps_per_window=settings.steps_per_window,
            total_steps=settings.steps,
            lr=settings.lr,
            warmup_steps=settings.warmup_steps,
            seed=settings.seed,
        ),
        quantize=QuantizeSection(per_channel=per_channel, lambda_warmup_steps=settings.lambda_warmup_steps),
    )
    outcome = Supervisor(runs_dir).start(cfg)
    if outcome.status != "completed":
        raise RunError(
            f"the BitNet fine-tuning run {outcome.run_id} is {outcome.status} at step {outcome.step}"
            + (f" ({outcome.pending_reason})" if outcome.pending_reason else "")
            + f"; continue it with `aegis resume --run-id {outcome.run_id}`, then compress its export/ folder"
        )
    export = RunPaths(Path(outcome.run_dir)).export
    return outcome.run_id, export


# ----- the whole phase -------------------------------------------------------------------------------------


def compress_calibrated(
    src: str | Path,
    out: str | Path,
    *,
    data: str,
    samples: int | None = None,
    seq_len: int = 256,
    eval_batch_size: int | None = None,
    finetune: FinetuneSettings | None = None,
    runs_dir: str | Path = "runs",
    max_drop: float | None = None,
    metric: Metric = "accuracy",
    revert: bool = True,
    per_channel: bool = False,
    scale_dtype: Literal["float32", "bfloat16"] = "float32",
    activations: Literal["int8", "none"] = "int8",
    chat_template: str | None = None,
    on_stage: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> BitNetReport:
    """Calibrate, fine-tune (``finetune``), revert, pack and report (module doc). ``samples``: calibration rows
    (default: the size category's count, capped by the data); ``max_drop``: revert threshold on the relative
    drop (default: the plan's critical bar, 10 %)."""
    import jax

    from aegis._outdir import output_dir
    from aegis.forge.bitnet import _check_compress_output, load_packed, _pack_model, size_category
    from aegis.models.source import locate_model
    from aegis.models.profiles import profile_from_config
    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    say = on_stage or (lambda s: None)
    out = _check_compress_output(src, out, overwrite=overwrite)  # before anything is computed
    source = locate_model(str(src))
    config = source.config()
    profile = profile_from_config(config, model_id=str(src), source="path")
    category = size_category(profile.total_params)
    n_samples = samples or CALIBRATION_SAMPLES[category.name]
    max_drop = ACCURACY_CRITICAL if max_drop is None else max_drop
    activ = activations == "int8"

    say(f"calibration: {n_samples} rows of {data}")
    calib = load_calibration(source.folder, data, samples=n_samples, seq_len=seq_len, chat_template=chat_template)
    if eval_batch_size is None:  # the planner's eval peak for this model on this device
        from aegis.forge._evo_fitness import plan_eval_batch

        eval_batch_size = min(16, plan_eval_batch(config, seq_len, len(calib)))
    batches = _eval_batches(calib, eval_batch_size, seq_len)
    model = build_model(config)
    ev = _Evaluator(model, per_channel, activ, batches)
    params = load_checkpoint(model, source.folder)
    stages = {"full_precision": ev.full_precision(params), "quantized": ev.quantized(params)}
    base = stages["full_precision"]
    say(f"full precision acc {base.accuracy:.4f}; quantised acc {stages['quantized'].accuracy:.4f}")

    weights_folder, run_id = source.folder, None
    if finetune is not None:
        say(f"STE fine-tuning: {finetune.steps} steps")
        run_id, weights_folder = finetune_ste(
            source.folder, finetune.data or data, finetune, runs_dir=runs_dir, per_channel=per_channel
        )
        params = load_checkpoint(model, weights_folder)
        stages["after_ste"] = ev.quantized(params)
        say(f"after STE acc {stages['after_ste'].accuracy:.4f}")

    current = stages.get("after_ste", stages["quantized"])
    keep: tuple[int, ...] = ()
    decisions: list[LayerDecision] = []
    if revert and relative_drop(base, current, metric) > max_drop:
        say(f"drop over {max_drop:.0%}: layer-wise revert")
        keep, decisions = layerwise_revert(
            lambda k: ev.quantized(params, k), base, model.spec.num_layers, max_drop=max_drop, metric=metric
        )
    if len(keep) == model.spec.num_layers:
        raise InvalidConfigError(
            f"every layer costs more than {max_drop:.0%} {metric} once quantised, so nothing would be compressed; "
            "fine-tune with --finetune (more steps), or raise --max-drop"
        )

    say("packing")
    with output_dir(out, overwrite=overwrite, writer="aegis compress") as tmp:
        result = _pack_model(weights_folder, tmp, per_channel=per_channel, scale_dtype=scale_dtype, keep_layers=keep)
        result = result.model_copy(update={"out": out})
        packed = load_packed(tmp, activations=activations)
        fwd = jax.jit(
            lambda p, b: packed.model.apply(
                _unpack_experts(p, packed.model.param_dtype), b["input_ids"], positions=b["positions"],
                segment_ids=b["segment_ids"],
            )
        )
        stages["final"] = evaluate(lambda b: fwd(packed.params, b), batches)

        drops = {k: relative_drop(base, v, metric) for k, v in stages.items()}
        acc_drop = relative_drop(base, stages["final"], "accuracy")
        report = BitNetReport(
            out=out,
            size_category=category.name,
            total_params=profile.total_params,
            calibration_examples=len(calib),
            metric=metric,
            max_drop=max_drop,
            stages=stages,
            drops=drops,
            perplexity_ratios={k: v.perplexity / base.perplexity for k, v in stages.items()},
            layer_decisions=tuple(decisions),
            reverted_layers=keep,
            run_id=run_id,
            compression=result,
            expected_sparsity=EXPECTED_SPARSITY[category.name],
            accuracy_verdict="ok" if acc_drop <= ACCURACY_WARNING else "warning" if acc_drop <= ACCURACY_CRITICAL else "critical",
            compression_verdict="ok" if result.total_compression >= 0.8 * category.target_compression else "low",
        )
        (tmp / REPORT_FILE).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return report


def _unpack_experts(params: Any, dtype: Any) -> Any:
    from aegis.forge.bitnet import unpack_params

    return unpack_params(params, dtype, experts_only=True)
