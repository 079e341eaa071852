"""Forge phase 4 on a Cognate model: BitNet b1.58 quantisation-aware fine-tuning (straight-through), packing, and
the packed model measured as it is served.

    student = TernaryCognate(build_cognate(config))          # every weight compress_model packs, run ternary (STE)
    logits = student.apply(params, ids)                      # = the packed folder's logits (lambda = 1)
    report = run_phase4("phase3/model", parity_rows(256), "phase4/", Phase4Settings(steps=60))

What is trained is what is served. :func:`aegis.forge.bitnet.compress_model` packs every on-disk tensor that
:func:`~aegis.forge.bitnet.is_ternary_target` names (in a Cognate layer: the attention, memory and feed-forward
projections, the memory's initial weights ``memory.w1``/``w2`` and its 1 x D gate projections); ``aegis generate``
loads the folder with :func:`~aegis.forge.bitnet.load_packed`, whose Cognate branch dequantises them
(``W_q * gamma``) and runs the plain Cognate forward: W1.58 A16, no activation quantiser. :class:`TernaryCognate`
runs the same forward with exactly those tensors replaced by :func:`aegis.forge.bitnet_train.weight_quant` (absmean
per layer slice, as the packer quantises each layer's tensor; per output channel with ``per_channel``) through the
straight-through estimator of :mod:`aegis.forge.bitnet_train` (``_ste``), with its lambda warm-up
(:func:`~aegis.forge.bitnet_train.warmup_lambda`); activations stay in float32 as the served model's do.

The loss (:func:`qat_loss`): the cross-entropy phase 3's baking trained on (its training rows, prompt + thought +
answer, scored from the prompt's last token) + ``kl_coef`` x KL(teacher || student) of the next-token
distributions at every real position, the teacher being phase 3's full-precision model (its log-probabilities
computed once). The optimizer is phase 3 baking's (Muon x Grokfast, the ``bake`` preset at ``lr``) or AdamW.

Measured (``report.json``, ``report.md``), on phase 3's held-out test rows (:func:`aegis.forge.quietstar.run.split_rows`
with phase 3's fractions; training uses its training rows only): top-1 agreement and KL of the packed model with
the phase-3 model, and the format-free accuracy with and without thoughts
(:func:`aegis.forge.quietstar.core.answer_scores`), for the phase-3 model, the compress-only packing and the
QAT packing, each packed model loaded from its folder the way ``aegis generate`` loads it; plus the largest logit
difference between the training-time forward at lambda = 1 and the served packed model.

Resume: a checkpoint of the latent weights, optimizer state and batch sampler every ``save_every`` steps under
``OUT/state/``; re-running after ``kill -9`` continues from the last one (the batches continue as if
uninterrupted); a run killed after training repacks and measures again. A non-Cognate model is packed without
fine-tuning (compress-only) and measured the same way.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Phase4Settings", "TernaryCognate", "qat_loss", "run_phase4", "ternary_targets"]


class Phase4Settings(BaseModel):
    """Phase 4's settings: the fine-tuning (``steps: 0`` packs the phase-3 model as it is) and the packing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(0, ge=0, description="Ternary-aware fine-tuning steps before packing (0: compress only).")
    lr: float = Field(1e-3, gt=0, description="Learning rate of the latent full-precision weights.")
    warmup: int = Field(0, ge=0, description="Lambda warm-up steps: the forward mixes full-precision and ternary "
                        "weights, lambda = min(step / warmup, 1) (0: ternary from the first step).")
    kl_coef: float = Field(1.0, ge=0, description="Weight of KL(phase-3 model || student) at every real position.")
    ce_coef: float = Field(1.0, ge=0, description="Weight of the cross-entropy on phase 3's baked training rows.")
    optimizer: Literal["muon_grokfast", "adamw"] = Field("muon_grokfast", description="Muon x Grokfast's 'bake' "
                                                         "preset at lr (phase 3's baking), or AdamW.")
    batch_size: int = Field(8, ge=1, le=4096, description="Training rows per step.")
    save_every: int = Field(25, ge=1, description="Steps between checkpoints under OUT/state.")
    seed: int = Field(0, ge=0)
    baseline: bool = Field(True, description="Also pack the phase-3 model without fine-tuning and measure it.")
    per_channel: bool = Field(False, description="gamma per output channel (else per tensor), trained and packed.")
    scale_dtype: Literal["float32", "bfloat16"] = Field("float32", description="How the packed scales are stored "
                                                        "(training sees float32 scales).")
    keep_layers: tuple[int, ...] = Field((), description="Decoder layers kept in full precision (not trained ternary, "
                                         "not packed).")


def ternary_targets(cfg: Any, keep_layers: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    """``{layer tensor name: [L] 0/1}``: which layers of each stacked Cognate tensor the packer stores ternary (the
    same :func:`~aegis.forge.bitnet.is_ternary_target` decision, tensor by tensor on its exported name)."""
    from aegis.forge.bitnet import is_ternary_target
    from aegis.forge.cognate.hyperparams import param_shapes

    shapes = param_shapes(cfg)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        if not is_ternary_target(name, shape, cfg.num_layers, keep_layers):
            continue
        prefix, rest = name.split(".layers.", 1)
        layer, key = rest.split(".", 1)
        if prefix != "model":
            raise AssertionError(f"a packed Cognate tensor outside the layer stack: {name}")
        out.setdefault(key, np.zeros(cfg.num_layers, np.float32))[int(layer)] = 1.0
    return out


@dataclass(frozen=True, eq=False)
class TernaryCognate:
    """A :class:`~aegis.forge.cognate.engine.CognateModel` whose packed tensors run BitNet b1.58 ternary (absmean,
    straight-through) with strength ``lam`` (1: the packed model; 0: full precision). The rest delegates to
    ``inner`` (``spec``, ``config``, ``project``, ``head_weight``, ``save``)."""

    inner: Any
    per_channel: bool = False
    keep_layers: tuple[int, ...] = ()
    lam: Any = 1.0
    lambda_warmup_steps: int = 0

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def at_step(self, step: Any) -> TernaryCognate:
        """The model a training step at ``step`` runs (lambda warm-up)."""
        from aegis.forge.bitnet_train import warmup_lambda

        return replace(self, lam=warmup_lambda(step, self.lambda_warmup_steps))

    def view(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with every packed tensor replaced by its straight-through ternary value (per layer slice)."""
        import jax
        import jax.numpy as jnp

        from aegis.forge.bitnet_train import _ste, weight_quant

        layers = dict(params["layers"])
        lam = jnp.asarray(self.lam, jnp.float32)
        for key, on in ternary_targets(self.inner.cfg, self.keep_layers).items():
            w = layers[key]
            q = jax.vmap(lambda x: weight_quant(x, self.per_channel))(w)
            layers[key] = _ste(w, q, (jnp.asarray(on) * lam)[:, None, None])
        return {**params, "layers": layers}

    def apply(self, params: dict[str, Any], ids: Any, **kw: Any) -> Any:
        return self.inner.apply(self.view(params), ids, **kw)

    def hidden(self, params: dict[str, Any], ids: Any, **kw: Any) -> Any:
        return self.inner.hidden(self.view(params), ids, **kw)


def qat_loss(student: Any, params: Any, x: Any, mask: Any, real: Any, teacher_logp: Any, kl_coef: float,
             ce_coef: float = 1.0) -> tuple[Any, dict[str, Any]]:
    """``ce_coef`` x the CE of ``x[:, 1:]`` where ``mask[:, :-1]`` (phase 3's baking loss) + ``kl_coef`` x the mean
    over ``real[:, :-1]`` of KL(teacher || student), ``teacher_logp [B, S-1, V]`` the teacher's log-probabilities."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(student.apply(params, x[:, :-1]).astype(jnp.float32), -1)
    m, r = mask[:, :-1], real[:, :-1]
    ce = -(jnp.take_along_axis(logp, x[:, 1:, None], -1)[..., 0] * m).sum() / jnp.maximum(m.sum(), 1)
    kl = ((jnp.exp(teacher_logp) * (teacher_logp - logp)).sum(-1) * r).sum() / jnp.maximum(r.sum(), 1)
    return ce_coef * ce + kl_coef * kl, {"ce": ce, "kl": kl}


# ----- the phase ---------------------------------------------------------------------------------------------


def _rows_data(tok: Any, rows: list[Any], holdout: float, validation: float) -> dict[str, Any]:
    """Phase 3's encoding and split of ``rows``: training arrays (baked rows, their loss mask and real positions),
    the test rows' baked rows, prompts and answers, and the task's answer set."""
    from aegis.forge.quietstar.run import _pad, _split_arrays, _tokenize, split_rows

    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    enc = _tokenize(tok, rows)
    test_idx, _val_idx, train_idx = split_rows(len(rows), holdout, validation)

    width = max(len(x) for x, _ in enc["bake"])  # one length for every split: one compiled forward

    def baked(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids, mask = _pad([enc["bake"][i] for i in idx], pad)
        _, real = _pad([(enc["bake"][i][0], 0) for i in idx], pad)  # every position whose next token is real
        more = ((0, 0), (0, width - ids.shape[1]))
        return np.pad(ids, more, constant_values=pad), np.pad(mask, more), np.pad(real, more)

    answers = sorted({tuple(a) for a in enc["answer"]})
    if len(answers) > 32:
        answers = []
    return {"pad": pad, "train": baked(train_idx), "test_baked": baked(test_idx), "answers": answers,
            "test": _split_arrays(enc, test_idx, pad, answers),
            "rows": {"train": len(train_idx), "test": len(test_idx)}}


_PROGRAMS: dict[Any, Any] = {}
"""Jitted programs by (kind, model shape, static settings): a resumed call in the same process, or the next model
of the same shape, reuses them instead of compiling again."""


def _model_key(model: Any) -> Any:
    cfg = getattr(model, "cfg", None)
    return cfg if cfg is not None else json.dumps(model.config, sort_keys=True, default=str)


def _program(key: Any, make: Callable[[], Any]) -> Any:
    if key not in _PROGRAMS:
        _PROGRAMS[key] = make()
    return _PROGRAMS[key]


class _Measure:
    """The held-out measurements of any params tree of ``model``'s shape (the phase-3 model, each packed model as
    served, the training-time view): one compiled program per kind."""

    CHUNK = 16

    def __init__(self, model: Any, tok: Any, data: dict[str, Any], mixer: Any, meta: dict[str, Any] | None):
        import jax
        import jax.numpy as jnp

        from aegis.forge.quietstar import core
        from aegis.forge.quietstar.reasoning_data import END, START

        self.data = data
        self.mixer = {k: jnp.asarray(v) for k, v in mixer.items()} if mixer is not None else None
        pad = data["pad"]
        mk = _model_key(model)
        self.logits = _program(("logp", mk), lambda: jax.jit(
            lambda p, x: jax.nn.log_softmax(model.apply(p, x).astype(jnp.float32), -1)))
        self.cands = None
        if data["answers"] and meta is not None and self.mixer is not None:
            a = data["answers"]
            cands = np.full((len(a), max(map(len, a))), pad, np.int32)
            for c, ans in enumerate(a):
                cands[c, : len(ans)] = ans
            self.cands = jnp.asarray(cands)
            start = tok.convert_tokens_to_ids(START)
            spec = core.ThoughtSpec(start, tok.convert_tokens_to_ids(END), pad, int(meta["thought_length"]), 1, 1,
                                    banned=(start,))

            def make() -> Any:
                @jax.jit
                def scores(p, mixer, ids, lens, cands, key):
                    sw, _ = core.answer_scores(model, p, mixer, ids, lens, cands, spec, thoughts=True, rng=key)
                    swo, _ = core.answer_scores(model, p, mixer, ids, lens, cands, spec, thoughts=False, rng=key)
                    return sw, swo

                return scores

            self.scores = _program(("scores", mk, spec), make)

    def logp(self, params: Any, ids: np.ndarray) -> np.ndarray:
        """Next-token log-probabilities ``[N, S-1, V]`` of ``ids[:, :-1]``, in chunks of :attr:`CHUNK` rows."""
        x = ids[:, :-1]
        n, c = len(x), self.CHUNK
        x = np.pad(x, ((0, -n % c), (0, 0)), constant_values=self.data["pad"])
        return np.concatenate([np.asarray(self.logits(params, x[i: i + c])) for i in range(0, len(x), c)])[:n]

    def accuracy(self, params: Any) -> dict[str, float]:
        import jax

        if self.cands is None:
            return {}
        t = self.data["test"]
        sw, swo = self.scores(params, self.mixer, t["ids"], t["len"], self.cands, jax.random.key(99))
        w = float(np.mean(np.argmax(np.asarray(sw), -1) == t["truth"]))
        wo = float(np.mean(np.argmax(np.asarray(swo), -1) == t["truth"]))
        return {"with_thoughts": w, "without_thoughts": wo, "gain": w - wo}

    def against(self, params: Any, teacher_logp: np.ndarray) -> dict[str, Any]:
        """Agreement and KL with the phase-3 model on the test rows, and the format-free accuracies."""
        ids, mask, real = self.data["test_baked"]
        lp = self.logp(params, ids)
        same = np.argmax(lp, -1) == np.argmax(teacher_logp, -1)
        r, m = real[:, :-1], mask[:, :-1]
        kl = (np.exp(teacher_logp) * (teacher_logp - lp)).sum(-1)
        return {"top1_agreement": float(same[r].mean()), "top1_agreement_scored": float(same[m].mean()),
                "kl_to_phase3": float(kl[r].mean()), **{f"accuracy_{k}": v for k, v in self.accuracy(params).items()}}


def _served(folder: Path) -> tuple[Any, Any]:
    """(model, params) of a packed folder exactly as ``aegis generate`` loads it."""
    from aegis.forge.generate import _engine

    model, params, _ = _engine(folder)
    return model, params


def _save_state(path: Path, st: dict[str, Any]) -> None:
    """Phase 3's checkpoint writer (atomic), called through this module so a test can stop a run at a checkpoint."""
    from aegis.forge.quietstar.run import _save_state as save

    save(path, st)


def run_phase4(src: str | Path, rows: list[Any], out: str | Path, settings: Phase4Settings | None = None, *,
               holdout: float = 0.25, validation: float = 0.125,
               log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Fine-tune (``settings.steps``), pack into ``OUT/model`` and measure phase 3's model folder ``src`` on its
    reasoning ``rows`` (split as phase 3 split them: ``holdout``, ``validation``); returns the report (also written
    to ``OUT/report.md``; the caller writes ``report.json``). ``out`` is the forge's phase folder: `run_forge` checked
    its OUT before writing any phase, and phase 4 replaces only what it writes there (``model/``, ``state/``,
    ``report.md``)."""
    import pickle

    import jax
    import jax.numpy as jnp
    import optax
    from transformers import AutoTokenizer

    from aegis._outdir import output_dir
    from aegis.forge._quiet_logs import quiet_cognate_config_warning
    from aegis.forge.bitnet import compress_model
    from aegis.forge.cognate.engine import build_cognate, is_cognate
    from aegis.forge.quietstar.run import load_quietstar_model

    t0 = time.time()
    settings = settings or Phase4Settings()
    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    with quiet_cognate_config_warning():
        tok = AutoTokenizer.from_pretrained(src, trust_remote_code=False)
    data = _rows_data(tok, rows, holdout, validation)
    qs = load_quietstar_model(src)
    meta, mixer = qs if qs is not None else (None, None)
    cognate = is_cognate(config)
    if cognate:
        model = build_cognate(config)
        teacher = model.load(src)
    else:
        from aegis.forge.generate import _engine

        model, teacher, _ = _engine(src)
    measure = _Measure(model, tok, data, mixer, meta)
    pack = {"per_channel": settings.per_channel, "scale_dtype": settings.scale_dtype,
            "keep_layers": tuple(settings.keep_layers)}

    def packed(latent: Path, folder: Path) -> Any:
        r = compress_model(latent, folder, overwrite=True, **pack)
        for extra in ("quietstar.json", "mixer.safetensors"):  # thoughts stay usable after packing
            if (src / extra).is_file():
                shutil.copy2(src / extra, folder / extra)
        return r

    test_ids = data["test_baked"][0]
    teacher_test = measure.logp(teacher, test_ids)
    stages: dict[str, Any] = {"phase3": {"top1_agreement": 1.0, "kl_to_phase3": 0.0,
                                         **{f"accuracy_{k}": v for k, v in measure.accuracy(teacher).items()}}}
    qat = settings.steps > 0 and cognate
    if settings.steps > 0 and not cognate:
        log("phase 4: not a Cognate model: packed without ternary-aware fine-tuning (compress only)")
    if settings.baseline or not qat:
        folder = out / "compress_only" if qat else out / "model"
        r = packed(src, folder)
        _, served = _served(folder)
        stages["compress_only"] = measure.against(served, teacher_test)
        log(f"phase 4: compress only: top-1 agreement {stages['compress_only']['top1_agreement']:.3f} with phase 3")
        if qat:
            shutil.rmtree(folder)  # measured; the phase's model is the fine-tuned one

    training: dict[str, Any] = {}
    if qat:
        student = TernaryCognate(model, per_channel=settings.per_channel, keep_layers=tuple(settings.keep_layers),
                                 lambda_warmup_steps=settings.warmup)
        static = (settings.optimizer, settings.lr, settings.warmup, settings.kl_coef, settings.ce_coef,
                  settings.per_channel, tuple(settings.keep_layers))

        def make_step() -> Any:
            if settings.optimizer == "muon_grokfast":
                from aegis.forge.optim import muon_grokfast

                tx = muon_grokfast("bake", lr=settings.lr)
            else:
                tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(settings.lr, weight_decay=0.0))

            @jax.jit
            def step(p, o, x, m, rl, tl, i):
                f = lambda q: qat_loss(student.at_step(i), q, x, m, rl, tl, settings.kl_coef,
                                       settings.ce_coef)
                (loss, aux), g = jax.value_and_grad(f, has_aux=True)(p)
                u, o = tx.update(g, o, p)
                return optax.apply_updates(p, u), o, loss, aux

            return tx, step, jax.jit(student.view)

        tx, step, view = _program(("qat", _model_key(model), static), make_step)
        ids, mask, real = data["train"]
        teacher_train = measure.logp(teacher, ids)
        state_path = out / "state" / "qat.pkl"
        rng = np.random.default_rng(settings.seed)
        if state_path.exists():
            with state_path.open("rb") as fh:
                st = pickle.load(fh)
            rng.bit_generator.state = st.pop("rng")
            st = jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, st)
            log(f"phase 4: resuming ternary-aware fine-tuning at step {st['step']}")
            resumed = int(st["step"])
        else:
            st = {"step": 0, "params": teacher, "opt": tx.init(teacher), "history": []}
            resumed = None

        def save() -> None:
            _save_state(state_path, {**st, "rng": rng.bit_generator.state})

        batch = min(settings.batch_size, len(ids))
        t_train = time.time()
        while st["step"] < settings.steps:
            sel = rng.choice(len(ids), batch, replace=False)
            st["params"], st["opt"], loss, aux = step(st["params"], st["opt"], ids[sel], mask[sel], real[sel],
                                                      teacher_train[sel], jnp.float32(st["step"]))
            st["step"] += 1
            st["history"].append({"step": st["step"], "loss": float(loss), "ce": float(aux["ce"]),
                                  "kl": float(aux["kl"])})
            if st["step"] % 20 == 0 or st["step"] == settings.steps:
                log(f"phase 4: ternary-aware step {st['step']}/{settings.steps}: loss {float(loss):.4f} "
                    f"ce {float(aux['ce']):.4f} kl {float(aux['kl']):.4f}")
            if st["step"] % settings.save_every == 0 or st["step"] == settings.steps:
                save()
        train_seconds = time.time() - t_train
        with output_dir(out / "state" / "latent", overwrite=True, writer="aegis forge") as tmp:
            model.save(st["params"], tmp, tokenizer=tok)  # the latent weights, as phase 3 exports
        r = packed(out / "state" / "latent", out / "model")
        _, served = _served(out / "model")
        stages["qat"] = measure.against(served, teacher_test)
        # the check that training ran what is served: the straight-through forward at lambda = 1 vs the packed model
        fake = measure.logp(view(st["params"]), test_ids)
        served_lp = measure.logp(served, test_ids)
        rmask = data["test_baked"][2][:, :-1]
        hist = st["history"]
        training = {
            "steps": settings.steps, "resumed_from_step": resumed, "lr": settings.lr, "optimizer": settings.optimizer,
            "lambda_warmup": settings.warmup, "kl_coef": settings.kl_coef, "ce_coef": settings.ce_coef,
            "batch_size": batch,
            "train_rows": data["rows"]["train"], "seconds_this_call": round(train_seconds, 1),
            "first": hist[0] if hist else None, "last": hist[-1] if hist else None,
            "loss": ("ce_coef x CE on phase 3's baked training rows (prompt + thought + answer, from the prompt's last "
                     "token) + kl_coef x KL(phase-3 model || student) at every real position"),
            "trained_forward_vs_served": {
                "max_abs_logprob_diff": float(np.abs(fake - served_lp)[rmask].max()),
                "top1_agreement": float((fake.argmax(-1) == served_lp.argmax(-1))[rmask].mean())},
        }
        log(f"phase 4: QAT: top-1 agreement {stages['qat']['top1_agreement']:.3f} with phase 3")

    a = data["answers"]
    truth = data["test"]["truth"]
    counts = np.bincount(truth[truth >= 0], minlength=max(1, len(a)))
    report = {
        "phase": "bitnet",
        "method": "ternary-aware fine-tuning (STE) then packing" if qat else "packing (compress only)",
        "total_params": r.total_params, "ternary_params": r.ternary_params, "sparsity": r.sparsity,
        "total_compression": r.total_compression, "target_compression": r.target_compression,
        "size_category": r.size_category, "per_channel": settings.per_channel,
        "served_as": ("load_packed, as aegis generate loads the folder: "
                      + ("W1.58 A16 (a Cognate model: dequantised ternary weights, float activations)" if cognate else
                         "W1.58 A8 (ternary linears packed, int8 activations per token)")),
        "held_out_rows": data["rows"]["test"],
        "chance": 1.0 / len(a) if a else None,
        "majority_baseline": float(counts.max() / max(1, counts.sum())) if a else None,
        "quality": stages, "training": training, "seconds": round(time.time() - t0, 1),
    }
    (out / "report.md").write_text(_markdown(report))
    return report


def _markdown(r: dict[str, Any]) -> str:
    q = r["quality"]
    num = lambda x: "-" if x is None else f"{x:.3f}"
    lines = ["# Phase 4: BitNet b1.58", "",
             (f"- method: {r['method']}; {r['ternary_params']:,} of {r['total_params']:,} parameters ternary "
              f"(sparsity {r['sparsity']:.3f}), whole-model compression {r['total_compression']:.2f}x "
              f"(target {r['target_compression']}x, category {r['size_category']})"),
             f"- served as: {r['served_as']}", "",
             (f"Quality on {r['held_out_rows']} held-out test rows of phase 3 (chance {num(r['chance'])}, "
              f"majority answer {num(r['majority_baseline'])}):"), "",
             "| model | top-1 agreement with phase 3 | KL to phase 3 | accuracy with thoughts | without | gain |",
             "|---|---|---|---|---|---|"]
    names = {"phase3": "phase 3 (full precision)", "compress_only": "packed, compress only",
             "qat": "packed after ternary-aware fine-tuning"}
    for k, d in q.items():
        lines.append(f"| {names[k]} | {num(d.get('top1_agreement'))} | {num(d.get('kl_to_phase3'))} | "
                     f"{num(d.get('accuracy_with_thoughts'))} | {num(d.get('accuracy_without_thoughts'))} | "
                     f"{num(d.get('accuracy_gain'))} |")
    t = r["training"]
    if t:
        c = t["trained_forward_vs_served"]
        lines += ["", (f"- fine-tuning: {t['steps']} steps ({t['optimizer']}, lr {t['lr']:g}, lambda warm-up "
                       f"{t['lambda_warmup']}, KL weight {t['kl_coef']:g}, CE weight {t['ce_coef']:g}, batch "
                       f"{t['batch_size']}); loss {t['first']['loss']:.4f} -> {t['last']['loss']:.4f}"),
                  (f"- training forward (lambda = 1) vs the served packed model: max |log-prob difference| "
                   f"{c['max_abs_logprob_diff']:.2e}, top-1 agreement {c['top1_agreement']:.4f}")]
    return "\n".join(lines) + "\n"
