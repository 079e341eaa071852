"""Phase 3 end to end: tokens -> prompt baking -> Quiet-STaR -> anti-theater checks -> ablation -> model folder.

    from aegis.forge.quietstar import QuietStarSettings, run_quietstar
    report = run_quietstar("merged/", "reasoning.jsonl", "out/", QuietStarSettings(bake_steps=500))
    print(report["ablation"]["gain"])       # held-out accuracy with thoughts - without

OUT holds ``model/`` (an HF folder: weights with the added tokens, the tokenizer, ``mixer.safetensors`` and
``quietstar.json``: the mixing head and thought settings that ``aegis generate`` reads), ``report.json`` and
``report.md``, and ``state/`` (a checkpoint every ``save_every`` steps: re-running resumes within the phase).
"""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from aegis.errors import DatasetError, InvalidConfigError

__all__ = ["QuietStarSettings", "run_quietstar", "load_quietstar_model"]


class QuietStarSettings(BaseModel):
    """Phase 3's settings; optimizer defaults are the seed's ``bake`` and ``rl`` presets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bake_steps: int = Field(200, ge=0, description="Most supervised prompt-baking steps on prompt + reasoning + "
                            "answer (fewer when bake_target_loss is reached).")
    bake_target_loss: float | None = Field(None, gt=0, description="Stop baking once the mean loss of the last "
                                           "bake_window steps is at most this (None: run bake_steps).")
    bake_window: int = Field(20, ge=1, description="Steps averaged for bake_target_loss.")
    bake_lr: float | None = Field(None, gt=0, description="Baking learning rate (default: the 'bake' preset's).")
    rl_steps: int = Field(50, ge=0, description="Quiet-STaR steps.")
    rl_lr: float | None = Field(None, gt=0, description="Quiet-STaR learning rate (default: the 'rl' preset's).")
    kl_coef: float | None = Field(None, ge=0, description="KL to the baked model (default: the 'rl' preset's).")
    batch_size: int | None = Field(None, ge=1, le=4096, description="Sequences per step (default: the planner's).")
    num_thoughts: int = Field(4, ge=2, le=64, description="Thoughts sampled in parallel per position (K).")
    thought_length: int | None = Field(None, ge=1, le=256, description="Tokens per thought (default: the data's).")
    n_true: int = Field(2, ge=1, le=32, description="True next tokens scored after each thought.")
    positions: int = Field(1, ge=1, le=256, description="Positions thought at per sequence and step.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of thoughts in training.")
    check_every: int = Field(25, ge=1, description="Steps between anti-theater checks.")
    min_divergence: float = Field(0.3, ge=0, description="Least answer divergence with vs without thoughts.")
    min_thought_length: float = Field(5.0, ge=0, description="Least mean thought length (tokens).")
    min_diversity: float = Field(3.0, ge=0, description="Least mean pairwise edit distance of a position's thoughts.")
    diversity_rows: int = Field(16, ge=1, description="Held-out rows whose K sampled thoughts the diversity check "
                                "compares (the accuracies use every held-out row).")
    holdout: float = Field(0.25, gt=0, lt=1, description="Fraction of rows held out for the ablation.")
    save_every: int = Field(50, ge=1, description="Steps between checkpoints under OUT/state.")
    seed: int = Field(0, ge=0)


def _tokenize(tok: Any, rows: list[Any]) -> dict[str, Any]:
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    out: dict[str, list] = {"bake": [], "plain": [], "prompt_len": [], "answer": [], "thought_len": []}
    start, end = tok.convert_tokens_to_ids("[thinking]"), tok.convert_tokens_to_ids("[/endthinking]")
    for r in rows:
        p, th, a = bos + enc(r.prompt), enc(r.reasoning), enc(r.answer)
        if start not in th or end not in th:
            raise DatasetError("the tokenizer splits [thinking] / [/endthinking]: they must be single tokens")
        out["bake"].append((p + th + a + eos, len(p) - 1))
        out["plain"].append((p + a + eos, len(p) - 1))
        out["prompt_len"].append(len(p))
        out["answer"].append(a)
        out["thought_len"].append(th.index(end) - th.index(start) - 1)
    return out


def _pad(seqs: list[tuple[list[int], int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids ``[N, S]`` and the loss mask (1 where predicting the next token counts: from the prompt's last token)."""
    s = max(len(x) for x, _ in seqs)
    ids = np.full((len(seqs), s), pad, np.int32)
    mask = np.zeros((len(seqs), s), bool)
    for i, (x, first) in enumerate(seqs):
        ids[i, : len(x)] = x
        mask[i, first: len(x) - 1] = True
    return ids, mask


def _save_state(path: Path, state: dict[str, Any]) -> None:
    import jax

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as fh:
        pickle.dump(jax.device_get(state), fh)
    os.replace(tmp, path)


def run_quietstar(
    model_dir: str | Path,
    data: str | Path | list[Any],
    out: str | Path,
    settings: QuietStarSettings = QuietStarSettings(),
    *,
    log: Callable[[str], None] = lambda s: None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run phase 3 on the HF folder ``model_dir`` (any causal LM the engine serves) with reasoning ``data`` (a
    JSONL path or :class:`~aegis.forge.quietstar.reasoning_data.ReasoningRow` list); returns the report (also in OUT)."""
    import jax
    import jax.numpy as jnp
    import optax
    from transformers import AutoTokenizer

    from aegis._outdir import check_output_dir, output_dir
    from aegis.forge.optim import muon_grokfast, preset
    from aegis.forge.quietstar import core
    from aegis.forge.quietstar.reasoning_data import END, START, THOUGHT_TOKENS, add_thinking_tokens, load_reasoning
    from aegis.forge.cognate.engine import build_cognate, is_cognate
    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint, save_checkpoint

    t_start = time.time()
    model_dir, out = Path(model_dir), Path(out)
    state_path = out / "state" / "quietstar.pkl"
    if not (model_dir / "config.json").is_file():
        raise InvalidConfigError(f"{model_dir} is not a model folder: pass a folder with config.json and *.safetensors")
    if not state_path.exists() and out.exists() and any(out.iterdir()):
        check_output_dir(out, overwrite=overwrite)
    rows = load_reasoning(data) if isinstance(data, (str, Path)) else list(data)
    config = json.loads((model_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)  # a Cognate config.json has auto_map: no prompt
    if is_cognate(config):  # a Cognate model (phase 1 -> 2 of the forge) behind the engine's interface
        base = build_cognate(config)
        params = base.load(model_dir)
    else:
        base = build_model(config)
        params = load_checkpoint(base, model_dir)
    model, params, size = add_thinking_tokens(base, params, tok)
    log(f"tokens: +{size.tokens_added} ({size.vocab_before} -> {size.vocab_after} vocab), "
        f"{size.params_before:,} -> {size.params_after:,} params (+{size.params_added:,})")
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    enc = _tokenize(tok, rows)
    n_hold = max(1, int(round(len(rows) * settings.holdout)))
    train_idx, hold_idx = np.arange(n_hold, len(rows)), np.arange(n_hold)
    if len(train_idx) < 1:
        raise DatasetError(f"{len(rows)} rows leave none to train on after holding out {n_hold}")
    bake_ids, bake_mask = _pad([enc["bake"][i] for i in train_idx], pad)
    plain_ids, plain_mask = _pad([enc["plain"][i] for i in train_idx], pad)
    hold_ids, _ = _pad([enc["plain"][i] for i in hold_idx], pad)
    hold_len = np.asarray([enc["prompt_len"][i] for i in hold_idx], np.int32)
    n_ans = max(len(enc["answer"][i]) for i in hold_idx)
    hold_ans = np.full((len(hold_idx), n_ans), pad, np.int32)
    for j, i in enumerate(hold_idx):
        hold_ans[j, : len(enc["answer"][i])] = enc["answer"][i]
    start_id, end_id = tok.convert_tokens_to_ids(START), tok.convert_tokens_to_ids(END)
    thought_ids = tuple(tok.convert_tokens_to_ids(t) for t in THOUGHT_TOKENS)
    T = settings.thought_length or max(enc["thought_len"])
    spec = core.ThoughtSpec(start_id, end_id, pad, T, settings.num_thoughts, settings.n_true, banned=(start_id,))
    batch = settings.batch_size
    if batch is None:  # the planner's micro batch for this model at the bake sequence length
        from aegis.forge._evo_fitness import plan_train_batch

        batch = plan_train_batch(model.config, int(bake_ids.shape[1]), cap=32)
    batch = min(batch, len(train_idx))
    kl0 = preset("rl").kl_coefficient if settings.kl_coef is None else settings.kl_coef

    # ----- state (resumed when OUT/state holds one) -----
    rng = np.random.default_rng(settings.seed)
    bake_tx = muon_grokfast("bake", lr=settings.bake_lr)
    rl_tx = muon_grokfast("rl", lr=settings.rl_lr)
    if state_path.exists():
        with state_path.open("rb") as fh:
            st = pickle.load(fh)
        log(f"resuming phase 3 at {st['stage']} step {st['step']}")
        rng_state = st.pop("rng", None)
        st = jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, st)
        if rng_state is not None:  # the batches continue as if uninterrupted
            rng.bit_generator.state = rng_state
        else:
            rng = np.random.default_rng(settings.seed + 1000 * (st["step"] + 1) + (st["stage"] == "rl"))
    else:
        mixer = core.init_mixer(jax.random.key(settings.seed), model.spec.hidden_size)
        st = {"stage": "bake", "step": 0, "params": params, "opt": bake_tx.init(params), "mixer": mixer,
              "history": {"bake_loss": [], "rl": [], "checks": []}, "kl_coef": kl0}
    hist = st["history"]
    resumed = {"stage": st["stage"], "step": int(st["step"])} if state_path.exists() else None
    ran = {"bake": 0, "rl": 0}  # steps run by this call (a resumed call runs only what the checkpoint lacks)

    def save() -> None:
        _save_state(state_path, {**st, "rng": rng.bit_generator.state})

    @jax.jit
    def bake_step(p, o, x, m):
        loss, g = jax.value_and_grad(core.bake_loss)(p, model, x, m)
        u, o = bake_tx.update(g, o, p)
        return optax.apply_updates(p, u), o, loss

    def converged() -> bool:
        w = settings.bake_window
        return (settings.bake_target_loss is not None and len(hist["bake_loss"]) >= w
                and float(np.mean(hist["bake_loss"][-w:])) <= settings.bake_target_loss)

    while st["stage"] == "bake" and st["step"] < settings.bake_steps and not converged():
        sel = rng.choice(len(train_idx), batch, replace=len(train_idx) < batch)
        st["params"], st["opt"], loss = bake_step(st["params"], st["opt"], bake_ids[sel], bake_mask[sel])
        st["step"] += 1
        ran["bake"] += 1
        hist["bake_loss"].append(float(loss))
        if st["step"] % 50 == 0:
            log(f"bake step {st['step']}/{settings.bake_steps}: loss {float(loss):.4f}")
        if st["step"] % settings.save_every == 0:
            save()
    if st["stage"] == "bake":
        if converged():
            log(f"bake converged at step {st['step']}: mean loss of the last {settings.bake_window} steps "
                f"{np.mean(hist['bake_loss'][-settings.bake_window:]):.4f} <= {settings.bake_target_loss}")
        hist["bake_steps_run"] = int(st["step"])
        st = {**st, "stage": "rl", "step": 0, "baked": st["params"], "opt": rl_tx.init((st["params"], st["mixer"]))}
        st["good"] = (st["params"], st["mixer"], st["opt"])
        save()
    baked = st["baked"]

    def sample_rows(p, x, pos, key):
        rows, posr = core.build_rows(x, jnp.repeat(pos, spec.num_thoughts, axis=1), spec)
        return core.sample_thoughts(model, p, rows, posr, spec, key, settings.temperature)

    @jax.jit
    def rl_step(p, mixer, o, x, m, pos, pos_w, key, kl_coef):
        rows = sample_rows(p, x, pos, key)

        def f(pm):
            return core.quietstar_loss(pm[0], pm[1], baked, model, x, m, pos, pos_w, rows, spec, kl_coef)

        (loss, aux), g = jax.value_and_grad(f, has_aux=True)((p, mixer))
        u, o = rl_tx.update(g, o, (p, mixer))
        p, mixer = optax.apply_updates((p, mixer), u)
        return p, mixer, o, loss, aux

    @jax.jit
    def answer_fn(p, mixer, key):
        args = (jnp.asarray(hold_ids), jnp.asarray(hold_len), jnp.asarray(hold_ans), spec)
        w, pw, rows = core.answer_accuracy(model, p, mixer, *args, thoughts=True, rng=key, disallowed=thought_ids)
        wo, pwo, _ = core.answer_accuracy(model, p, mixer, *args, thoughts=False, rng=key, disallowed=thought_ids)
        return w, wo, pw, pwo, rows

    n_div = min(settings.diversity_rows, len(hold_idx))

    @jax.jit
    def thoughts_fn(p, key):  # K sampled thoughts at the answer position of the first n_div held-out rows
        pos = jnp.asarray(hold_len[:n_div] - 1)[:, None]
        return sample_rows(p, jnp.asarray(hold_ids[:n_div]), pos, key)

    def checks(p, mixer, key) -> dict[str, Any]:
        w, wo, pw, pwo, _ = answer_fn(p, mixer, key)
        pw, pwo = np.asarray(pw), np.asarray(pwo)
        div = float(np.mean([core.edit_distance(a, b) / max(1, len(a)) for a, b in zip(pw, pwo)]))
        rows = np.asarray(thoughts_fn(p, key))
        start = np.repeat(hold_len[:n_div] - 1, spec.num_thoughts) + 2
        th = [r[s: s + T] for r, s in zip(rows, start)]
        stop = {end_id, pad, tok.eos_token_id}
        lens = [next((i for i, t in enumerate(x) if t in stop), T) for x in th]
        th = [list(x[:n]) for x, n in zip(th, lens)]
        k = spec.num_thoughts
        divs = [core.edit_distance(th[g * k + a], th[g * k + b]) for g in range(len(th) // k)
                for a in range(k) for b in range(a + 1, k)]
        res = {"accuracy_with_thoughts": float(np.mean(w)), "accuracy_without": float(np.mean(wo)),
               "divergence": div, "thought_length": float(np.mean(lens)), "diversity": float(np.mean(divs))}
        res["passed"] = bool(res["divergence"] >= settings.min_divergence
                             and res["thought_length"] >= settings.min_thought_length
                             and res["diversity"] >= settings.min_diversity)
        return res

    key = jax.random.key(settings.seed + 17)
    before = checks(st["baked"], st["mixer"], key) if not hist["checks"] else hist["checks"][0]
    if not hist["checks"]:
        hist["checks"].append({"step": 0, **before, "action": "baseline (baked)"})
    n_pos = settings.positions
    while st["step"] < settings.rl_steps:
        sel = rng.choice(len(train_idx), batch, replace=len(train_idx) < batch)
        x, m = plain_ids[sel], plain_mask[sel]
        pos = np.zeros((batch, n_pos), np.int32)
        pos_w = np.zeros((batch, n_pos), np.float32)
        for b in range(batch):
            cand = np.flatnonzero(m[b])
            pick = rng.choice(cand, min(n_pos, len(cand)), replace=False) if len(cand) else np.zeros(1, int)
            pos[b, : len(pick)], pos_w[b, : len(pick)] = pick, 1.0 if len(cand) else 0.0
        k_step = jax.random.fold_in(key, st["step"] + 1000 * len(hist["checks"]))
        p, mixer, o, loss, aux = rl_step(st["params"], st["mixer"], st["opt"], x, m, pos, pos_w, k_step,
                                         jnp.float32(st["kl_coef"]))
        st.update(params=p, mixer=mixer, opt=o)
        st["step"] += 1
        ran["rl"] += 1
        hist["rl"].append({"step": st["step"], "loss": float(loss), **{k: float(v) for k, v in aux.items()}})
        if st["step"] % 10 == 0:
            log(f"quiet-star step {st['step']}/{settings.rl_steps}: loss {float(loss):.4f} "
                f"nll {float(aux['nll']):.4f} kl {float(aux['kl']):.4f} w {float(aux['mix_weight']):.2f}")
        if st["step"] % settings.check_every == 0 or st["step"] == settings.rl_steps:
            res = checks(st["params"], st["mixer"], key)
            if res["passed"]:
                st["good"] = (st["params"], st["mixer"], st["opt"])
                res["action"] = "kept"
            else:  # theater: roll back to the last checkpoint that passed, tie the model closer to the baked one
                st["params"], st["mixer"], st["opt"] = st["good"]
                st["kl_coef"] = float(st["kl_coef"]) * 2.0 if float(st["kl_coef"]) > 0 else 0.1
                res["action"] = f"rolled back; kl {float(st['kl_coef']):g}"
            hist["checks"].append({"step": st["step"], **res})
            log(f"anti-theater at step {st['step']}: divergence {res['divergence']:.2f}, thought length "
                f"{res['thought_length']:.1f}, diversity {res['diversity']:.2f} -> {res['action']}")
        if st["step"] % settings.save_every == 0:
            save()

    last = hist["checks"][-1]
    if last["step"] == settings.rl_steps and last.get("action") in ("kept", "baseline (baked)"):
        final = {k: v for k, v in last.items() if k not in ("step", "action")}  # the weights it checked are final
    else:
        final = checks(st["params"], st["mixer"], jax.random.key(settings.seed + 99))
    report = {
        "phase": "quietstar",
        "model": str(model_dir),
        "size_change": {**size.__dict__, "params_added": size.params_added},
        "tokens": list(THOUGHT_TOKENS),
        "rows": {"train": int(len(train_idx)), "held_out": int(len(hold_idx))},
        "batch_size": int(batch),
        "thought": {"length": T, "num_thoughts": spec.num_thoughts, "n_true": spec.n_true},
        "bake": {"steps": int(hist.get("bake_steps_run", settings.bake_steps)), "max_steps": settings.bake_steps,
                 "target_loss": settings.bake_target_loss, "window": settings.bake_window,
                 "first_loss": hist["bake_loss"][0] if hist["bake_loss"] else None,
                 "last_loss": hist["bake_loss"][-1] if hist["bake_loss"] else None,
                 "last_window_mean": float(np.mean(hist["bake_loss"][-settings.bake_window:]))
                 if hist["bake_loss"] else None},
        "resumed_from": resumed, "steps_run": ran,
        "quietstar": {"steps": settings.rl_steps, "kl_coef_final": float(st["kl_coef"]),
                      "last": hist["rl"][-1] if hist["rl"] else None},
        "anti_theater": {"thresholds": {"divergence": settings.min_divergence,
                                        "thought_length": settings.min_thought_length,
                                        "diversity": settings.min_diversity},
                         "checks": hist["checks"], "final": final,
                         "rollbacks": sum(1 for c in hist["checks"] if str(c.get("action", "")).startswith("rolled"))},
        "ablation": {"held_out_rows": int(len(hold_idx)), "accuracy_with_thoughts": final["accuracy_with_thoughts"],
                     "accuracy_without": final["accuracy_without"],
                     "gain": final["accuracy_with_thoughts"] - final["accuracy_without"],
                     "baked_gain": before["accuracy_with_thoughts"] - before["accuracy_without"]},
        "seconds": round(time.time() - t_start, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    with output_dir(out / "model", overwrite=True, writer="aegis quietstar") as tmp:
        if getattr(model, "family", None) == "cognate":
            model.save(st["params"], tmp, tokenizer=tok)  # its own modeling code and config, as phase 1 exports
        else:
            save_checkpoint(model, st["params"], tmp)
            tok.save_pretrained(tmp)
        from aegis.train.safetensors_io import write_shards

        write_shards(tmp / "_mixer", {f"mixer.{k}": np.asarray(v, np.float32) for k, v in st["mixer"].items()})
        (tmp / "_mixer" / "model.safetensors").rename(tmp / "mixer.safetensors")
        for f in (tmp / "_mixer").iterdir():
            f.unlink()
        (tmp / "_mixer").rmdir()
        (tmp / "quietstar.json").write_text(json.dumps({
            "start_token": START, "end_token": END, "thought_length": T, "tokens": list(THOUGHT_TOKENS)}, indent=2))
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    (out / "report.md").write_text(_markdown(report))
    return report


def _markdown(r: dict[str, Any]) -> str:
    a, s, f = r["ablation"], r["size_change"], r["anti_theater"]["final"]
    return "\n".join([
        "# Phase 3: Quiet-STaR", "",
        f"- tokens: +{s['tokens_added']} (vocab {s['vocab_before']} -> {s['vocab_after']}), "
        f"params {s['params_before']:,} -> {s['params_after']:,} (+{s['params_added']:,})",
        f"- baking: {r['bake']['steps']} steps, loss {r['bake']['first_loss']} -> {r['bake']['last_loss']}",
        f"- Quiet-STaR: {r['quietstar']['steps']} steps, {r['thought']['num_thoughts']} thoughts of "
        f"{r['thought']['length']} tokens, final KL coefficient {r['quietstar']['kl_coef_final']:g}",
        f"- ablation on {a['held_out_rows']} held-out rows: with thoughts {a['accuracy_with_thoughts']:.3f}, without "
        f"{a['accuracy_without']:.3f}, gain {a['gain']:+.3f}",
        f"- anti-theater: divergence {f['divergence']:.2f}, thought length {f['thought_length']:.1f}, diversity "
        f"{f['diversity']:.2f} ({'passed' if f['passed'] else 'failed'}); rollbacks {r['anti_theater']['rollbacks']}",
        "",
    ])


def load_quietstar_model(folder: str | Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(quietstar.json, mixer params)`` of a phase-3 model folder, or None for any other folder."""
    folder = Path(folder)
    if not (folder / "quietstar.json").is_file():
        return None
    from safetensors.numpy import load_file

    mix = {k.removeprefix("mixer."): v for k, v in load_file(folder / "mixer.safetensors").items()}
    return json.loads((folder / "quietstar.json").read_text()), mix

