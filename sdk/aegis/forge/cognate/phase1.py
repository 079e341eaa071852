"""Phase 1 of the forge: train three Cognate variants from scratch, check that they differ, export each.

    folders = run_phase1({}, Path("out/phase1_cognate"), tiny=True)      # the bundled samples, ~2 minutes on a CPU
    folders = run_phase1(load_phase1_config("phase1.yml"), Path("out"))  # real scale (a GPU)

The seed's three variants (reasoning, memory, speed) differ in ACT threshold (0.95, 0.90, 0.99), long-term memory
slots (2048, 8192, 2048), data mix and seed (42, 43, 44), and train for 10 : 12 : 8 of the step budget. Each is
trained with the three-stage curriculum (foundation: math + code; reasoning: qa, commonsense, language; advanced:
the same, longer), the stage's rows drawn by the variant's mix, with Muon x Grokfast (``aegis.forge.optim``, preset
"pretrain"). Then the diversity checks on held-out rows, with the seed's thresholds: spread (max - min over the three)
of the mean ACT halting steps > 2.0, of the memory share (the MAG gate's 1 - g) > 0.3, of forward latency > 10 ms.
A failed check retrains the variant closest to the others with a changed seed (``diversity.retries`` times), then
is reported as a warning.

``train.batch_size: auto`` (the default; ``--tiny`` pins 4) reads the batch at run time: the training step is compiled
at the run's seq_len for powers of two up to ``train.max_batch_size`` (bisection) and XLA's memory analysis of each is
held against the device's memory limit (a GPU's ``bytes_limit``; on a CPU ``train.host_memory_gib``) less
``train.memory_headroom`` (`cognate.step_memory`); the largest that fits trains, reusing that compiled step, and each
variant's ``report.json`` records it under ``batch``.

``OUT/<variant>/`` is a Hugging Face folder (loads with ``trust_remote_code=True``) with ``report.json``; its presence
is the variant's completion marker (the folder is published atomically), so a re-run after ``kill -9`` skips it.
``OUT/.cognate-work/`` holds stage checkpoints (a killed variant resumes at its last finished stage) and
``OUT/report.json`` / ``OUT/report.md`` the phase's summary.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from aegis.train import compile_cache
from aegis.errors import InvalidConfigError, OutputPathError
from aegis.forge.cognate.hyperparams import TINY_MODEL, CognateConfig
from aegis.forge.cognate.corpus import CATEGORIES

__all__ = ["Phase1Config", "Variant", "Stage", "load_phase1_config", "run_phase1", "STATE_FILE"]

STATE_FILE = "phase1.json"
WORK = ".cognate-work"
Category = Literal["math", "code", "qa", "commonsense", "language"]


class Variant(BaseModel):
    """One of the three models."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Folder name under OUT.")
    act_threshold: float = Field(gt=0, le=1, description="ACT halting threshold.")
    ltm_slots: int = Field(ge=1, le=65536, description="Long-term memory slots (the seed: 2048-8192).")
    seed: int = Field(ge=0, description="Initialisation and data-order seed.")
    mix: dict[Category, float] = Field(description="Category -> weight of its rows.")
    steps_scale: float = Field(1.0, gt=0, le=100, description="This variant's share of the step budget (epochs).")


class Stage(BaseModel):
    """One curriculum stage."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    categories: list[Category] = Field(min_length=1)
    fraction: float = Field(gt=0, le=1, description="Share of the variant's steps.")


class TrainSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    steps: int = Field(3000, ge=1, le=10_000_000, description="Steps per variant (times its steps_scale).")
    batch_size: int | Literal["auto"] = Field("auto", description="Sequences per step, or 'auto': the largest "
                                              "power of two <= max_batch_size whose compiled step fits the memory "
                                              "budget (XLA's memory analysis, `cognate.step_memory`).")
    max_batch_size: int = Field(16, ge=1, le=65536, description="auto's cap (the seed's batch: 16).")
    host_memory_gib: float = Field(8.0, gt=0, description="auto's budget where the device reports no memory limit "
                                   "(a CPU); a GPU's is its bytes_limit.")
    memory_headroom: float = Field(0.1, ge=0, lt=1, description="Share of the budget auto keeps free.")
    seq_len: int = Field(512, ge=2, le=1_000_000)
    lr: float = Field(1e-3, gt=0, le=10, description="Peak LR (the seed's Muon x Grokfast pretrain preset: 1e-3).")
    warmup_steps: int = Field(100, ge=0)
    optimizer: Literal["muon_grokfast", "adamw"] = "muon_grokfast"
    qk_clip_tau: float | None = Field(30.0, gt=0, description="QK-clip (Kimi K2's MuonClip; the pretrain preset's "
                                      "tau): after each step, a head whose largest attention logit in the step's "
                                      "forward exceeded tau has W_q and W_k scaled by sqrt(tau / max). None: off.")
    shared_shape: bool = Field(False, description="Train every variant at the widest LTM, the extra slots held at "
                               "zero (exact: a zero slot never activates, its gradient is zero), so one program "
                               "compiles; exported at the variant's own width. For CPU runs.")
    eval_rows: int = Field(8, ge=1, le=4096, description="Held-out sequences for the diversity checks.")

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch(cls, v: Any) -> Any:
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65536):
            return v
        raise ValueError(f"give 'auto' or a whole number 1-65536, not {v!r}")


class Diversity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    min_halting_spread: float = Field(2.0, ge=0, description="Seed: ACT steps max - min > 2.0.")
    min_memory_spread: float = Field(0.3, ge=0, description="Seed: memory share max - min > 0.3.")
    min_latency_spread_ms: float = Field(10.0, ge=0, description="Seed: forward latency max - min > 10 ms.")
    retries: int = Field(1, ge=0, le=10, description="Retrains with a changed seed when a check fails.")


SEED_VARIANTS = [
    Variant(name="reasoning", act_threshold=0.95, ltm_slots=2048, seed=42, steps_scale=1.0,
            mix={"math": 0.4, "qa": 0.3, "code": 0.1, "commonsense": 0.1, "language": 0.1}),
    Variant(name="memory", act_threshold=0.90, ltm_slots=8192, seed=43, steps_scale=1.2,
            mix={"language": 0.4, "qa": 0.3, "math": 0.1, "code": 0.1, "commonsense": 0.1}),
    Variant(name="speed", act_threshold=0.99, ltm_slots=2048, seed=44, steps_scale=0.8,
            mix={"commonsense": 0.4, "math": 0.3, "code": 0.1, "qa": 0.1, "language": 0.1}),
]
SEED_CURRICULUM = [
    Stage(name="foundation", categories=["math", "code"], fraction=0.3),
    Stage(name="reasoning", categories=["qa", "commonsense", "language"], fraction=0.3),
    Stage(name="advanced", categories=["qa", "commonsense", "language"], fraction=0.4),
]


class Phase1Config(BaseModel):
    """``aegis cognate CONFIG OUT``: every field optional (the seed's plan)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: dict[str, Any] = Field(default_factory=dict, description="CognateConfig fields (vocab_size: the BPE's).")
    variants: list[Variant] = Field(default_factory=lambda: list(SEED_VARIANTS), min_length=1)
    curriculum: list[Stage] = Field(default_factory=lambda: list(SEED_CURRICULUM), min_length=1)
    data: dict[Category, list[str]] | None = Field(
        None, description="Category -> sources: local .jsonl / .json / .csv / .parquet files, local dataset folders or "
        "Hub dataset ids read from the `datasets` cache (none: the bundled samples).")
    tokenizer: str | None = Field(None, description="A local tokenizer folder; none: a BPE trained on the data.")
    train: TrainSettings = TrainSettings()
    diversity: Diversity = Diversity()


TINY: dict[str, Any] = {
    "model": {**TINY_MODEL, "vocab_size": 512},
    "train": {"steps": 24, "batch_size": 4, "seq_len": 48, "lr": 3e-3, "warmup_steps": 3, "eval_rows": 4,
              "shared_shape": True},
    "diversity": {"retries": 0},
    "variants": [v.model_copy(update={"ltm_slots": v.ltm_slots // 8}).model_dump() for v in SEED_VARIANTS],
}
"""What ``--tiny`` puts under the config: the CPU-sized model (memory 16 wide), a few dozen steps, no retries, and
the seed's variants with an eighth of the LTM slots (256, 1024, 256: the same 1 : 4 contrast, at CPU cost)."""


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_phase1_config(source: str | Path | dict[str, Any] | None = None, *, tiny: bool = False) -> Phase1Config:
    """A YAML file or a dict -> :class:`Phase1Config`; ``tiny`` lays the config over :data:`TINY`.
    Errors are one :class:`~aegis.errors.InvalidConfigError` line."""
    data: Any = {} if source is None else source
    if isinstance(source, (str, Path)):
        import yaml

        path = Path(source).expanduser()
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as err:
            raise InvalidConfigError(f"cannot read phase-1 config {source} ({err.strerror}); give a YAML file") from None
        except yaml.YAMLError as err:
            raise InvalidConfigError(f"phase-1 config {source} is not YAML ({' '.join(str(err).split())[:200]})") from None
    if not isinstance(data, dict):
        raise InvalidConfigError(f"phase-1 config must be a mapping, got {type(data).__name__}")
    if isinstance(data.get("phase1"), dict):  # the pipeline's file: its phase1 section
        data = data["phase1"]
    if tiny:
        data = _merge(TINY, data)
    try:
        cfg = Phase1Config(**data)
        CognateConfig(**{**cfg.model, "vocab_size": cfg.model.get("vocab_size", 8192)})
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(x) for x in e["loc"]) or "config"
        raise InvalidConfigError(f"phase-1 config: {where}: {e['msg']}") from None
    names = [v.name for v in cfg.variants]
    if len(set(names)) != len(names):
        raise InvalidConfigError(f"phase-1 config: variant names repeat ({', '.join(names)}); give each its own")
    return cfg


def _digest(cfg: Phase1Config) -> str:
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()[:16]


def _variant_done(folder: Path) -> bool:
    try:
        return json.loads((folder / "report.json").read_text(encoding="utf-8")).get("complete") is True
    except (OSError, ValueError):
        return False


# ----- training --------------------------------------------------------------------------------------------------

_STEPS: dict[Any, Any] = {}


def _labels(params: dict[str, Any]) -> dict[str, Any]:
    """Muon for the weight matrices (attention, memory, feed-forward, y_proj); AdamW for the rest."""
    def one(name: str, leaf: Any, stacked: bool) -> str:
        shape = leaf.shape[1:] if stacked else leaf.shape
        matrix = len(shape) == 2 and min(shape) > 1 and not name.startswith(("model.embed", "model.persistent"))
        return "muon" if matrix else "adam"

    out = {k: one(k, v, False) for k, v in params.items() if k != "layers"}
    out["layers"] = {k: one(k, v, True) for k, v in params["layers"].items()}
    return out


def _optimizer(settings: TrainSettings) -> Any:
    """The update direction at unit learning rate (the step multiplies by the schedule's value)."""
    import optax

    if settings.optimizer == "muon_grokfast":
        from aegis.forge.optim import muon_grokfast

        return muon_grokfast("pretrain", lr=1.0, labels=_labels)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1.0, weight_decay=0.01))


def qk_clip_cognate(params: dict[str, Any], max_logits: Any, tau: float, cfg: CognateConfig) -> dict[str, Any]:
    """MuonClip on a Cognate tree: each layer's head ``h`` whose largest logit ``max_logits[l, h]`` exceeds ``tau``
    has its rows of ``q_proj`` and ``k_proj`` scaled by ``sqrt(tau / max)`` (RoPE is a rotation inside the head,
    so that head's logits scale by ``tau / max``); the other heads are untouched."""
    import jax.numpy as jnp

    from aegis.forge.optim import qk_clip_heads

    q_s, k_s = qk_clip_heads(jnp.asarray(max_logits, jnp.float32), tau, cfg.num_heads)  # (L, H) each
    layers = dict(params["layers"])
    for name, s in (("q_proj.weight", q_s), ("k_proj.weight", k_s)):
        w = layers[name]  # (L, H*hd, D)
        layers[name] = w * jnp.repeat(s, cfg.head_dim, axis=-1)[..., None].astype(w.dtype)
    return {**params, "layers": layers}


def _train_step(cfg: CognateConfig, settings: TrainSettings) -> tuple[Any, Any]:
    """(optimizer, jitted step) shared by variants of one shape (the ACT threshold is an argument). The step
    applies QK-clip after the update with the max logits of its own forward (``settings.qk_clip_tau``)."""
    import jax
    import jax.numpy as jnp
    import optax

    from aegis.forge.cognate.model import lm_loss

    tau = settings.qk_clip_tau
    key = _step_key(cfg, settings)
    if key not in _STEPS:
        tx = _optimizer(settings)
        shape_cfg = key[0]

        @jax.jit
        def step(params, opt_state, ids, threshold, lr):
            (loss, metrics), grads = jax.value_and_grad(lm_loss, has_aux=True)(params, shape_cfg, ids, threshold)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, jax.tree.map(lambda u: lr * u, updates))
            if tau is not None:
                params = qk_clip_cognate(params, metrics["max_logits"], tau, shape_cfg)
                metrics = {**metrics, "clipped_heads": jnp.sum(metrics["max_logits"] > tau)}
            return params, opt_state, metrics

        _STEPS[key] = (tx, step)
    return _STEPS[key]


def _step_key(cfg: CognateConfig, settings: TrainSettings) -> tuple[Any, ...]:
    return cfg.model_copy(update={"act_threshold": 1.0}), settings.optimizer, settings.qk_clip_tau


def _shape_cfg(cfg: CognateConfig, p1: Phase1Config) -> CognateConfig:
    """The shape a variant trains at: with ``train.shared_shape``, the widest variant's LTM."""
    if p1.train.shared_shape:
        return cfg.model_copy(update={"ltm_slots": max(x.ltm_slots for x in p1.variants)})
    return cfg


_BATCHES: dict[Any, Any] = {}


def _choose_batch(cfg: CognateConfig, p1: Phase1Config) -> tuple[int, dict[str, Any]]:
    """(batch size, its report entry): the configured number, or for ``auto`` the largest power of two up to
    ``train.max_batch_size`` whose compiled step fits the memory budget (`cognate.step_memory`). The chosen
    batch's executable is kept for the training loop."""
    s = p1.train
    if s.batch_size != "auto":
        return s.batch_size, {"batch_size": s.batch_size, "chosen_by": "config"}
    import jax
    import jax.numpy as jnp

    from aegis.forge.cognate.model import init_params
    from aegis.forge.cognate.step_memory import fit_batch, memory_budget

    shape = _shape_cfg(cfg, p1)
    budget, source = memory_budget(host_gib=s.host_memory_gib, headroom=s.memory_headroom)
    key = (_step_key(shape, s), s.seq_len, s.max_batch_size, budget)
    if key not in _BATCHES:
        tx, step = _train_step(shape, s)
        params = jax.eval_shape(lambda k: init_params(shape, k), jax.random.key(0))
        opt_state = jax.eval_shape(tx.init, params)
        scalar = jax.ShapeDtypeStruct((), jnp.float32)

        def args_for(b: int) -> tuple[Any, ...]:
            return params, opt_state, jax.ShapeDtypeStruct((b, s.seq_len), jnp.int32), scalar, scalar

        _BATCHES[key] = fit_batch(step, args_for, cap=s.max_batch_size, budget_bytes=budget, budget_source=source)
    choice = _BATCHES[key]
    return choice.batch_size, choice.to_json()


def _compiled_step(cfg: CognateConfig, s: TrainSettings) -> Any:
    """The executable ``_choose_batch`` compiled for this shape and batch, if any."""
    for (k, seq, _cap, _budget), choice in _BATCHES.items():
        if k == _step_key(cfg, s) and seq == s.seq_len and choice.batch_size == s.batch_size:
            return choice.compiled
    return None


def _lr(settings: TrainSettings, step: int, total: int) -> float:
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / (settings.warmup_steps + 1)
    frac = (step - settings.warmup_steps) / max(1, total - settings.warmup_steps)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _save_state(path: Path, params: Any, opt_state: Any, meta: dict[str, Any]) -> None:
    import jax
    import numpy as np

    leaves = jax.tree.leaves((params, opt_state))
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, *[np.asarray(x) for x in leaves], meta=np.asarray(json.dumps(meta)))
    tmp.replace(path)


def _load_state(path: Path, params: Any, opt_state: Any) -> tuple[Any, Any, dict[str, Any]] | None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    try:
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            treedef = jax.tree.structure((params, opt_state))
            leaves = [jnp.asarray(z[f"arr_{i}"]) for i in range(treedef.num_leaves)]
    except (OSError, KeyError, ValueError):
        return None
    params, opt_state = jax.tree.unflatten(treedef, leaves)
    return params, opt_state, meta


def _train_variant(v: Variant, seed: int, cfg: CognateConfig, p1: Phase1Config, streams: dict[str, Any],
                   work: Path, log: Callable[[str], None]) -> tuple[Any, list[dict[str, Any]]]:
    import jax
    import numpy as np

    from aegis.forge.cognate.corpus import sample_batch
    from aegis.forge.cognate.model import init_params

    s = p1.train
    total = max(len(p1.curriculum), round(s.steps * v.steps_scale))
    own = cfg.ltm_slots
    cfg = _shape_cfg(cfg, p1)
    tx, step = _train_step(cfg, s)
    step = _compiled_step(cfg, s) or step
    params = _widen(init_params(cfg.model_copy(update={"ltm_slots": own}), jax.random.key(seed)), cfg.ltm_slots)
    opt_state = tx.init(params)
    history: list[dict[str, Any]] = []
    done_steps, first_stage = 0, 0
    work.mkdir(parents=True, exist_ok=True)
    fracs = [st.fraction for st in p1.curriculum]
    bounds = np.cumsum([0.0] + fracs) / sum(fracs)
    plan = [(st, int(round(bounds[i] * total)), int(round(bounds[i + 1] * total))) for i, st in enumerate(p1.curriculum)]
    for i in reversed(range(len(plan))):
        ck = work / f"stage{i}.npz"
        if ck.is_file():
            loaded = _load_state(ck, params, opt_state)
            if loaded is not None and loaded[2].get("seed") == seed:
                params, opt_state, meta = loaded
                history, first_stage = meta["history"], i + 1
                log(f"  {v.name}: resumed after stage {plan[i][0].name}")
                break
    for i, (stage, lo, hi) in enumerate(plan):
        if i < first_stage:
            continue
        weights = {c: v.mix.get(c, 0.0) for c in stage.categories}
        if sum(weights.values()) <= 0:
            weights = {c: 1.0 for c in stage.categories}
        rng = np.random.default_rng([seed, i])
        t0 = time.perf_counter()
        losses, max_logit, clipped = [], 0.0, 0
        for n in range(lo, hi):
            ids = sample_batch(streams, weights, rng, batch=s.batch_size, seq_len=s.seq_len)
            params, opt_state, metrics = step(params, opt_state, ids, np.float32(v.act_threshold),
                                              np.float32(_lr(s, n, total)))
            losses.append(float(metrics["ce"]))
            max_logit = max(max_logit, float(metrics["max_logits"].max()))
            clipped += int(metrics.get("clipped_heads", 0))
            if not math.isfinite(losses[-1]):
                raise InvalidConfigError(f"variant {v.name}: the loss is {losses[-1]} at step {n}; lower train.lr")
        history.append({"stage": stage.name, "steps": hi - lo, "categories": list(weights),
                        "first_ce": losses[0] if losses else None, "last_ce": losses[-1] if losses else None,
                        "max_attention_logit": round(max_logit, 3), "qk_clipped_heads": clipped,
                        "seconds": round(time.perf_counter() - t0, 2)})
        if losses:
            log(f"  {v.name}: stage {stage.name} ({hi - lo} steps) CE {losses[0]:.3f} -> {losses[-1]:.3f}")
        _save_state(work / f"stage{i}.npz", params, opt_state, {"seed": seed, "history": history})
    return _narrow(params, own), history


def _widen(params: dict[str, Any], slots: int) -> dict[str, Any]:
    """Zero-pad the memory MLP to ``slots`` hidden units (w1 columns, w2 rows)."""
    import jax.numpy as jnp

    layers = dict(params["layers"])
    w1, w2 = layers["memory.w1"], layers["memory.w2"]
    layers["memory.w1"] = jnp.pad(w1, [(0, 0), (0, 0), (0, slots - w1.shape[2])])
    layers["memory.w2"] = jnp.pad(w2, [(0, 0), (0, slots - w2.shape[1]), (0, 0)])
    return {**params, "layers": layers}


def _narrow(params: dict[str, Any], slots: int) -> dict[str, Any]:
    """The first ``slots`` memory units; the rest must have stayed exactly zero."""
    layers = dict(params["layers"])
    w1, w2 = layers["memory.w1"], layers["memory.w2"]
    if w1.shape[2] > slots and (bool((w1[:, :, slots:] != 0).any()) or bool((w2[:, slots:] != 0).any())):
        raise AssertionError("padded memory slots moved; train without train.shared_shape")
    layers["memory.w1"], layers["memory.w2"] = w1[:, :, :slots], w2[:, :slots]
    return {**params, "layers": layers}


# ----- measurement -----------------------------------------------------------------------------------------------

_EVALS: dict[Any, Any] = {}


def _measure(params: Any, cfg: CognateConfig, ids: Any) -> dict[str, float]:
    """Held-out perplexity, mean ACT halting steps, memory share and forward latency (median of 5, ms)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from aegis.forge.cognate.model import forward

    key = cfg.model_copy(update={"act_threshold": 1.0})
    if key not in _EVALS:
        _EVALS[key] = jax.jit(lambda p, x, th: forward(p, key, x, th))
    fn = _EVALS[key]
    th = np.float32(cfg.act_threshold)
    out = jax.block_until_ready(fn(params, ids, th))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, ids, th)["logits"])
        times.append((time.perf_counter() - t0) * 1000)
    logp = jax.nn.log_softmax(out["logits"][:, :-1], axis=-1)
    ce = -float(jnp.mean(jnp.take_along_axis(logp, jnp.asarray(ids)[:, 1:, None], axis=-1)))
    return {"perplexity": round(math.exp(min(ce, 50.0)), 3), "halting_steps": round(float(out["steps"].mean()), 4),
            "ponder": round(float(out["ponder"].mean()), 4), "memory_usage": round(float(out["memory_usage"].mean()), 4),
            "latency_ms": round(float(np.median(times)), 3)}


def _diversity(metrics: list[dict[str, float]], d: Diversity) -> tuple[dict[str, Any], list[str]]:
    checks = {"halting_steps": d.min_halting_spread, "memory_usage": d.min_memory_spread,
              "latency_ms": d.min_latency_spread_ms}
    out: dict[str, Any] = {}
    failed = []
    for name, bar in checks.items():
        values = [m[name] for m in metrics]
        spread = max(values) - min(values)
        ok = len(values) < 2 or spread > bar
        out[name] = {"values": values, "spread": round(spread, 4), "threshold": bar, "passed": ok}
        if not ok:
            failed.append(f"{name} spread {spread:.3g} <= {bar:g}")
    return out, failed


def _closest(metrics: list[dict[str, float]]) -> int:
    """The variant nearest the others (normalised halting, memory, latency): the one a new seed should move."""
    keys = ("halting_steps", "memory_usage", "latency_ms")
    scale = {k: (max(m[k] for m in metrics) - min(m[k] for m in metrics)) or 1.0 for k in keys}
    dist = [sum(abs(a[k] - b[k]) / scale[k] for b in metrics for k in keys) for a in metrics]
    return dist.index(min(dist))


def _size(n: int) -> dict[str, Any]:
    cat = "tiny" if n < 50e6 else "small" if n < 500e6 else "medium" if n < 2e9 else "large"
    return {"params": n, "size_mb": round(n * 4 / 2**20, 2), "size_category": cat}


def _markdown(summary: dict[str, Any]) -> str:
    lines = ["# Phase 1: Cognate", "", "| variant | params | ACT thr. | LTM slots | seed | perplexity | halting steps | "
             "memory share | latency ms |", "|---|---|---|---|---|---|---|---|---|"]
    for v in summary["variants"]:
        m = v["metrics"]
        lines.append(f"| {v['name']} | {v['size']['params']:,} | {v['act_threshold']} | {v['ltm_slots']} | {v['seed']} "
                     f"| {m['perplexity']} | {m['halting_steps']} | {m['memory_usage']} | {m['latency_ms']} |")
    lines += ["", "## Diversity (seed thresholds)", ""]
    for name, c in summary["diversity"].items():
        lines.append(f"- {name}: spread {c['spread']} (needs > {c['threshold']}): {'pass' if c['passed'] else 'FAIL'}")
    for w in summary["warnings"]:
        lines.append(f"- warning: {w}")
    return "\n".join(lines) + "\n"


# ----- the phase -------------------------------------------------------------------------------------------------


def run_phase1(config: dict[str, Any] | Phase1Config | str | Path | None, out: Path, *, tiny: bool = False,
               overwrite: bool = False, log: Callable[[str], None] | None = None) -> list[Path]:
    """Train, check and export the variants into ``out``; returns their folders (in the config's order).
    Re-running after a kill skips finished variants and resumes a started one at its last finished stage."""
    from aegis._outdir import check_output_dir, write_output_file

    log = log or (lambda _line: None)
    compile_cache.enable()
    p1 = config if isinstance(config, Phase1Config) else load_phase1_config(config, tiny=tiny)
    out = Path(out).expanduser().absolute()
    state_path = out / STATE_FILE
    digest = _digest(p1)
    state = None
    if state_path.is_file():
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
        except ValueError:
            state = None
    if state is not None and state.get("config") != digest and not overwrite:
        raise OutputPathError(f"{out} holds a phase-1 run of another config; pass --overwrite to retrain there, "
                              "or choose another folder")
    if state is None:
        check_output_dir(out, overwrite=overwrite)
    out.mkdir(parents=True, exist_ok=True)
    if state is None or state.get("config") != digest:
        state = {"config": digest, "seeds": {v.name: v.seed for v in p1.variants}, "retries": []}
        for v in p1.variants:  # a new config retrains every variant
            if _variant_done(out / v.name):
                (out / v.name / "report.json").unlink()
    write_output_file(state_path, json.dumps(state, indent=1) + "\n", overwrite=True)

    import numpy as np

    from aegis.forge.cognate.corpus import encode_streams, load_tokenizer, read_categories, train_tokenizer

    texts = read_categories(p1.data)
    held = {c: ts[::10] for c, ts in texts.items()}
    train_texts = {c: [t for i, t in enumerate(ts) if i % 10] or ts for c, ts in texts.items()}
    if p1.tokenizer:
        tok = load_tokenizer(p1.tokenizer)
    else:
        tok = train_tokenizer(texts, int(p1.model.get("vocab_size", 8192)))
    vocab = len(tok)
    streams = encode_streams(train_texts, tok)
    eval_ids = _eval_batch(encode_streams(held, tok), p1)
    folders, metrics, reports = [], [], []

    def build(v: Variant, seed: int) -> tuple[Path, dict[str, Any], dict[str, Any]]:
        folder = out / v.name
        cfg = CognateConfig(**{**p1.model, "vocab_size": vocab, "act_threshold": v.act_threshold,
                               "ltm_slots": v.ltm_slots})
        if _variant_done(folder):
            report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
            if report.get("seed") == seed:
                log(f"{v.name}: complete, skipped")
                return folder, report["metrics"], report
        log(f"{v.name}: training (ACT {v.act_threshold}, LTM {v.ltm_slots}, seed {seed}, "
            f"{cfg.num_parameters():,} params)")
        t0 = time.perf_counter()
        batch, batch_report = _choose_batch(cfg, p1)
        log(f"  {v.name}: {batch_report.get('summary') or f'batch {batch} (configured)'}")
        p1v = p1.model_copy(update={"train": p1.train.model_copy(update={"batch_size": batch})})
        params, history = _train_variant(v, seed, cfg, p1v, streams, out / WORK / f"{v.name}-{seed}", log)
        m = _measure(params, cfg, eval_ids)
        report = {"complete": True, "name": v.name, "act_threshold": v.act_threshold, "ltm_slots": v.ltm_slots,
                  "seed": seed, "mix": v.mix, "size": _size(cfg.num_parameters()), "metrics": m,
                  "curriculum": history, "batch": batch_report, "optimizer": p1.train.optimizer, "train_seconds":
                  round(time.perf_counter() - t0, 1), "architecture": cfg.model_dump()}
        from aegis.forge.cognate.hf_folder import save_pretrained

        save_pretrained(params, cfg, folder, tokenizer=tok, overwrite=True,
                        extra_files={"report.json": json.dumps(report, indent=1) + "\n"})
        shutil.rmtree(out / WORK / f"{v.name}-{seed}", ignore_errors=True)  # its stage checkpoints are spent
        log(f"{v.name}: perplexity {m['perplexity']}, halting {m['halting_steps']}, memory {m['memory_usage']}, "
            f"{m['latency_ms']} ms -> {folder}")
        return folder, m, report

    for v in p1.variants:
        f, m, r = build(v, int(state["seeds"].get(v.name, v.seed)))
        folders.append(f), metrics.append(m), reports.append(r)
    checks, failed = _diversity(metrics, p1.diversity)
    while failed and len(state["retries"]) < p1.diversity.retries:
        i = _closest(metrics)
        v = p1.variants[i]
        new_seed = int(state["seeds"][v.name]) + 1000
        log(f"diversity check failed ({'; '.join(failed)}): retraining {v.name} with seed {new_seed}")
        state["seeds"][v.name] = new_seed
        state["retries"].append({"variant": v.name, "seed": new_seed, "failed": failed})
        write_output_file(state_path, json.dumps(state, indent=1) + "\n", overwrite=True)
        folders[i], metrics[i], reports[i] = build(v, new_seed)
        checks, failed = _diversity(metrics, p1.diversity)
    warnings = [f"diversity check failed: {f}" for f in failed]
    if any(not c["passed"] for k, c in checks.items() if k == "halting_steps") and max(
            CognateConfig(**{**p1.model, "vocab_size": vocab}).max_passes - 1, 0) <= p1.diversity.min_halting_spread:
        warnings.append(f"the halting spread cannot exceed {p1.diversity.min_halting_spread} with at most "
                        f"{p1.model.get('max_passes', 3)} passes (the seed's threshold assumes more steps)")
    summary = {"phase": "phase1_cognate", "config": digest, "tiny": tiny,
               "variants": reports, "diversity": checks, "retries": state["retries"], "warnings": warnings,
               "folders": [str(f) for f in folders]}
    with contextlib.suppress(OSError):
        (out / WORK).rmdir()
    write_output_file(out / "report.json", json.dumps(summary, indent=1) + "\n", overwrite=True)
    write_output_file(out / "report.md", _markdown(summary), overwrite=True)
    for w in warnings:
        log(f"warning: {w}")
    return folders


def _eval_batch(streams: dict[str, Any], p1: Phase1Config) -> Any:
    import numpy as np

    from aegis.forge.cognate.corpus import sample_batch

    weights = {c: 1.0 for c in CATEGORIES}
    return sample_batch(streams, weights, np.random.default_rng(0), batch=p1.train.eval_rows,
                        seq_len=p1.train.seq_len)
