"""EvoMerge fitness: evaluate a model folder with the JAX engine, guard against degenerate merges, hash
weights for the fitness cache, and measure population diversity.

    ev = Evaluator(examples, seq_len=256, batch_size=plan_eval_batch(config, 256, len(examples)))
    m = ev.evaluate(folder)           # Metrics: perplexity, accuracy, flops_per_token, weight_bytes
    problem = degenerate(folder)      # None, or why the weights are unusable (NaN/Inf, constant matrix)
    h = weights_hash(folder)          # sha256 of the safetensors files: the fitness cache key
    d, dist = diversity(folders, base)  # mean pairwise cosine distance of the weight deltas from the base

Evaluation runs the engine's own forward (:func:`aegis.train.modeling.build_model` +
:func:`aegis.train.weights.load_checkpoint`, ``Model.apply``) on the held-out examples packed into
fixed-shape batches (:func:`aegis.train.data.iter_batches`); one compiled program per distinct config
(candidates of equal depth share it). Perplexity is ``exp`` of the mean next-token NLL over the target
tokens; accuracy the share of target tokens whose argmax prediction is right.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from aegis.schema import Frozen

__all__ = ["Metrics", "Evaluator", "plan_eval_batch", "plan_train_batch", "degenerate", "weights_hash", "diversity", "flops_per_token",
           "FITNESS_WEIGHTS", "fitness_weights", "composite_fitness"]

FITNESS_WEIGHTS: dict[str, dict[str, float]] = {
    "tiny": {"perplexity": 0.5, "accuracy": 0.3, "speed": 0.1, "memory": 0.1},
    "small": {"perplexity": 0.4, "accuracy": 0.3, "speed": 0.2, "memory": 0.1},
    "large": {"perplexity": 0.4, "accuracy": 0.3, "speed": 0.15, "memory": 0.15},
}
"""The seed's size-adaptive weights (Agent Forge phase 2): tiny < 100 MB of weights, small < 1 GB, large."""
_SIZE_BOUNDS_MB = (("tiny", 100.0), ("small", 1000.0))


def fitness_weights(weight_bytes: int) -> tuple[str, dict[str, float]]:
    """The size category of a model of ``weight_bytes`` (in MB, 10^6 bytes as the seed's ``size_mb``) and its weights."""
    mb = weight_bytes / 1e6
    for name, bound in _SIZE_BOUNDS_MB:
        if mb < bound:
            return name, FITNESS_WEIGHTS[name]
    return "large", FITNESS_WEIGHTS["large"]


class Metrics(Frozen):
    """What one evaluation measured."""

    perplexity: float = Field(description="exp(mean next-token NLL) over the eval targets (inf when not finite).")
    accuracy: float = Field(description="Share of eval target tokens predicted right (argmax).")
    nll: float = Field(description="Mean next-token NLL (nats).")
    tokens: int = Field(description="Target tokens evaluated.")
    flops_per_token: float = Field(description="Forward FLOPs per token at the eval length (from the config).")
    weight_bytes: int = Field(description="Bytes of the safetensors files.")
    num_layers: int = Field(description="Decoder layers.")
    eval_seconds: float = Field(description="Wall-clock of the evaluation (information only; not in the fitness).")


def composite_fitness(m: Metrics, ref: Metrics, weights: dict[str, float]) -> float:
    """The seed's composite with each term normalised to the parents' mean (``ref``): 1.0 at their level.

    ``w_ppl * ref.ppl / ppl + w_acc * acc / ref.acc + w_speed * ref.flops / flops + w_mem * ref.bytes / bytes``.
    The seed sums raw ``1/ppl``, ``acc``, ``1/time`` and ``1/memory``, whose units make the weights meaningless;
    ratios to the parents keep the weights' intent. Speed is the forward cost per token from the config (FLOPs),
    not a timing: a timed term would make the fitness of one set of weights vary from run to run, which a
    fitness cache keyed by the weights, and a resumed run that must repeat an uninterrupted one, cannot allow.
    A non-finite perplexity scores 0 on every term."""
    if not math.isfinite(m.perplexity) or not math.isfinite(m.nll):
        return 0.0
    acc = m.accuracy / ref.accuracy if ref.accuracy > 0 else m.accuracy
    return (
        weights["perplexity"] * ref.perplexity / m.perplexity
        + weights["accuracy"] * acc
        + weights["speed"] * ref.flops_per_token / m.flops_per_token
        + weights["memory"] * ref.weight_bytes / m.weight_bytes
    )


def _config(folder: Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))


def flops_per_token(config: dict[str, Any], seq_len: int) -> float:
    """Forward FLOPs per token at ``seq_len``: the planner's count (`aegis.planning.throughput.token_flops`) of the config."""
    from aegis.forge.cognate.engine import flops_per_token as cognate_flops
    from aegis.forge.cognate.engine import is_cognate
    from aegis.models.profiles import profile_from_config
    from aegis.planning.throughput import token_flops

    if is_cognate(config):  # not a planner family: counted from its own shapes
        return cognate_flops(config, seq_len)
    return token_flops(profile_from_config(config, model_id="candidate", source="path"), "full", seq_len).forward


def _device_budget_bytes() -> int:
    """90% of the eval device's memory (the seed's utilisation): the accelerator's limit, else free host RAM."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    if not limit:
        limit = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(0.9 * limit)


def plan_eval_batch(config: dict[str, Any], seq_len: int, n_examples: int, budget_bytes: int | None = None) -> int:
    """The largest power-of-two eval batch (at most ``n_examples``) whose eval peak, as the planner predicts it
    for the JAX engine (:func:`aegis.planning.memory.estimate_memory`, ``eval_peak_bytes``), fits the device budget."""
    return _largest_batch(config, seq_len, n_examples, budget_bytes, lambda e: e.eval_peak_bytes, eval_batch=True)


def plan_train_batch(config: dict[str, Any], seq_len: int, cap: int, budget_bytes: int | None = None) -> int:
    """The largest power-of-two micro batch (at most ``cap``) whose fp32 full fine-tuning step, as the planner
    predicts it for the JAX engine (``tensor_bytes``), fits the device budget (BitNet's STE run)."""
    return _largest_batch(config, seq_len, cap, budget_bytes, lambda e: e.tensor_bytes, eval_batch=False)


def _largest_batch(config, seq_len, cap, budget_bytes, peak, *, eval_batch: bool) -> int:
    from aegis.forge.cognate.engine import eval_peak_bytes, is_cognate
    from aegis.planning.memory.estimate import estimate_memory
    from aegis.models.profiles import profile_from_config

    budget = _device_budget_bytes() if budget_bytes is None else budget_bytes
    if is_cognate(config):  # not a planner family: its own count (x3 for a training step's gradients and state)

        def fits(b: int) -> bool:
            return (1 if eval_batch else 3) * eval_peak_bytes(config, batch=b, seq_len=seq_len) <= budget
    else:
        profile = profile_from_config(config, model_id="forge", source="path")

        def fits(b: int) -> bool:
            kw = dict(eval_batch_size=b, eval_seq_len=seq_len, micro_batch_size=1) if eval_batch else dict(micro_batch_size=b)
            e = estimate_memory(profile, method="full", framework="jax", precision="fp32", seq_len=seq_len, **kw)
            return peak(e) <= budget

    b = 1
    while b * 2 <= max(1, cap) and fits(b * 2):
        b *= 2
    return b


class Evaluator:
    """Held-out examples, and a compiled eval step per distinct config."""

    def __init__(self, examples: Sequence[Any], *, seq_len: int, batch_size: int):
        self.examples = list(examples)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self._compiled: dict[str, tuple[Any, Any]] = {}

    def _step(self, config: dict[str, Any]) -> tuple[Any, Any]:
        key = json.dumps(config, sort_keys=True)
        if key not in self._compiled:
            import jax
            import jax.numpy as jnp

            from aegis.forge.cognate.engine import build_cognate, is_cognate
            from aegis.train.modeling import build_model

            model = build_cognate(config) if is_cognate(config) else build_model(config)

            def step(params, ids, targets, mask, seg, pos):
                logits = model.apply(params, ids, positions=pos, segment_ids=seg).astype(jnp.float32)
                logz = jax.nn.logsumexp(logits, axis=-1)
                picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
                right = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
                return jnp.sum((logz - picked) * mask), jnp.sum(right * mask), jnp.sum(mask)

            self._compiled[key] = (model, jax.jit(step))
        return self._compiled[key]

    def evaluate(self, folder: Path) -> Metrics:
        import time

        from aegis.train.data import iter_batches
        from aegis.train.weights import load_checkpoint

        start = time.perf_counter()
        config = _config(folder)
        model, step = self._step(config)
        cognate = getattr(model, "family", None) == "cognate"  # no segment ids: one example per row
        params = model.load(folder) if cognate else load_checkpoint(model, folder)
        nll = right = count = 0.0
        for batch in iter_batches(self.examples, self.batch_size, self.seq_len, packing=not cognate):
            a = batch.arrays()
            s_nll, s_right, s_n = step(params, a["input_ids"], a["targets"], a["loss_mask"], a["segment_ids"], a["positions"])
            nll, right, count = nll + float(s_nll), right + float(s_right), count + float(s_n)
        mean = nll / max(count, 1.0)
        ppl = math.exp(mean) if math.isfinite(mean) and mean < 700 else math.inf
        return Metrics(
            perplexity=ppl, accuracy=right / max(count, 1.0), nll=mean if math.isfinite(mean) else math.inf,
            tokens=int(count), flops_per_token=flops_per_token(config, self.seq_len), weight_bytes=_weight_bytes(folder),
            num_layers=int(model.spec.num_layers), eval_seconds=time.perf_counter() - start,
        )


def _weight_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


def _weight_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in _weight_files(folder))


def weights_hash(folder: Path) -> str:
    """sha256 over the folder's safetensors files (names and bytes, in name order)."""
    h = hashlib.sha256()
    for f in _weight_files(folder):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _tensors(folder: Path):
    from safetensors import safe_open

    for f in _weight_files(folder):
        with safe_open(str(f), framework="numpy") as h:
            for k in h.keys():
                yield k, h.get_tensor(k)


def degenerate(folder: Path) -> str | None:
    """Why a merged model is unusable, or None: a NaN or Inf weight, or a weight matrix (2-D or more) whose
    entries are all equal (variance < 1e-8 with more than one entry). Vectors (norm weights, biases) are not
    checked for variance: a norm weight of ones is a healthy initialisation, not a broken merge."""
    for name, t in _tensors(folder):
        if not np.issubdtype(t.dtype, np.floating) and t.dtype.kind != "V":
            continue
        x = t.astype(np.float32)
        if not np.isfinite(x).all():
            return f"{name} has {'NaN' if np.isnan(x).any() else 'Inf'} values"
        if x.ndim >= 2 and x.size > 1 and float(x.var()) < 1e-8:
            return f"{name} has zero variance"
    return None


def diversity(folders: Sequence[Path], base: Path) -> tuple[float, np.ndarray]:
    """Mean pairwise cosine distance between the candidates' weight deltas from ``base`` (flattened), and the
    distance matrix. Candidates of different depth are compared over the tensors both have (by name) with
    the base's shape; a candidate equal to the base (zero delta) is at distance 1 from every other."""
    from safetensors import safe_open

    n = len(folders)
    handles = []
    for folder in folders:
        files = {}
        for f in _weight_files(folder):
            h = safe_open(str(f), framework="numpy")
            for k in h.keys():
                files[k] = h
        handles.append(files)
    gram = np.zeros((n, n))
    sq = np.zeros((n, n))  # sq[a, b]: |delta_a|^2 over the tensors a shares with b
    for name, base_t in _tensors(base):
        base32 = base_t.astype(np.float32).reshape(-1)
        rows, present = [], np.zeros(n)
        for i, files in enumerate(handles):
            if name in files and tuple(files[name].get_slice(name).get_shape()) == base_t.shape:
                rows.append(files[name].get_tensor(name).astype(np.float32).reshape(-1) - base32)
                present[i] = 1.0
            else:
                rows.append(np.zeros_like(base32))
        d = np.stack(rows).astype(np.float64)
        gram += d @ d.T
        sq += np.outer((d * d).sum(axis=1), present)
    denom = np.sqrt(sq * sq.T)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(denom > 0, gram / np.where(denom > 0, denom, 1.0), 0.0)
    dist = 1.0 - np.clip(cos, -1.0, 1.0)
    np.fill_diagonal(dist, 0.0)
    pairs = [dist[i, j] for i in range(n) for j in range(i + 1, n)]
    return (float(np.mean(pairs)) if pairs else 0.0), dist
