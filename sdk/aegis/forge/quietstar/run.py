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

__all__ = ["QuietStarSettings", "run_quietstar", "load_quietstar_model", "split_rows", "select_step", "selection_score"]


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
    holdout: float = Field(0.25, gt=0, lt=1, description="Fraction of rows held out as test rows: scored once, "
                           "on the selected model, for the ablation.")
    validation: float = Field(0.125, gt=0, lt=1, description="Fraction of rows (disjoint from the test and training "
                              "rows) on which each checkpoint's gain of thoughts is measured to select the model "
                              "and on which the anti-theater checks run.")
    max_answers: int = Field(32, ge=2, description="Most distinct answers for the format-free ablation (each row "
                             "scored on which of the task's answers the model prefers); more: free-form answers, "
                             "only the free-generation accuracy is reported.")
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
        # the thought starts right after the prompt, as Quiet-STaR inserts it (``x_<=i [thinking] ...``): text before
        # the start marker (a space) would shift every baked offset by one against the thoughts sampled later
        th = th[th.index(start): th.index(end) + 1]
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


def split_rows(n: int, holdout: float, validation: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row indices ``(test, validation, train)``, disjoint: the first ``holdout`` fraction is the test rows, the next
    ``validation`` fraction the validation rows, the rest trains."""
    n_test = max(1, int(round(n * holdout)))
    n_val = max(1, int(round(n * validation)))
    if n - n_test - n_val < 1:
        raise DatasetError(f"{n} rows leave none to train on after {n_test} test and {n_val} validation rows: "
                           "pass more rows or lower holdout / validation")
    idx = np.arange(n)
    return idx[:n_test], idx[n_test: n_test + n_val], idx[n_test + n_val:]


def _split_arrays(enc: dict[str, Any], idx: np.ndarray, pad: int, answers: list[tuple[int, ...]]) -> dict[str, Any]:
    """One split's rows: prompt + answer ids, prompt lengths, answer ids, the answer's index in ``answers``."""
    ids, _ = _pad([enc["plain"][i] for i in idx], pad)
    n_ans = max(len(enc["answer"][i]) for i in idx)
    ans = np.full((len(idx), n_ans), pad, np.int32)
    for j, i in enumerate(idx):
        ans[j, : len(enc["answer"][i])] = enc["answer"][i]
    index = {a: c for c, a in enumerate(answers)}
    truth = np.asarray([index.get(tuple(enc["answer"][i]), -1) for i in idx], np.int64)
    return {"ids": ids, "len": np.asarray([enc["prompt_len"][i] for i in idx], np.int32), "ans": ans,
            "truth": truth, "idx": idx}


_CURVE_KEYS = ("format_free_with_thoughts", "format_free_without_thoughts", "format_free_gain",
               "free_generation_with_thoughts", "free_generation_without_thoughts", "free_generation_gain")


def selection_score(res: dict[str, Any]) -> tuple[float, float]:
    """What model selection maximises: the validation gain of thoughts (format-free where the task has an answer
    set, else free generation), then the with-thoughts accuracy."""
    kind = "format_free" if "format_free_gain" in res else "free_generation"
    return (float(res[f"{kind}_gain"]), float(res[f"{kind}_with_thoughts"]))


def select_step(curve: list[dict[str, Any]]) -> int:
    """The step model selection keeps from a validation curve: the baked model (step 0) is always a candidate, a
    Quiet-STaR checkpoint only if it passed the anti-theater checks (a failed one was rolled back); the highest
    :func:`selection_score` wins, ties keep the earlier step."""
    best = curve[0]
    for c in curve[1:]:
        if c.get("passed") and selection_score(c) > selection_score(best):
            best = c
    return int(best["step"])


def hist_at(hist: dict[str, Any], step: int) -> dict[str, Any]:
    """The last validation check recorded at ``step``."""
    return [c for c in hist["checks"] if c["step"] == step][-1]


def _ablation(final: dict[str, Any], baked: dict[str, Any], test: dict[str, Any], answers: list[tuple[int, ...]],
              tok: Any, step: int) -> dict[str, Any]:
    """The report's ablation on the test rows (scored once, on the selected model)."""
    a: dict[str, Any] = {
        "held_out_rows": int(len(test["idx"])), "selected_step": step,
        "free_generation": {
            "with_thoughts": final["free_generation_with_thoughts"],
            "without_thoughts": final["free_generation_without_thoughts"],
            "gain": final["free_generation_gain"],
            "how": "greedy answer tokens (teacher-forced past the first), thought markers excluded: an answer out of "
                   "the task's format counts as wrong"},
    }
    if "format_free_gain" in final:
        counts = np.bincount(test["truth"][test["truth"] >= 0], minlength=len(answers))
        a["format_free"] = {
            "with_thoughts": final["format_free_with_thoughts"],
            "without_thoughts": final["format_free_without_thoughts"],
            "gain": final["format_free_gain"],
            "how": "the answer whose tokens have the highest summed log-likelihood after the prompt (+ a greedy "
                   "thought), among the task's valid answers: measures the answer, not its format"}
        a["answers"] = [tok.decode(list(x)) for x in answers]
        a["chance"] = 1.0 / len(answers)
        a["majority_baseline"] = float(counts.max() / max(1, counts.sum()))
        a["gain"] = a["format_free"]["gain"]
    else:
        a["answers"], a["chance"], a["majority_baseline"] = None, None, None
        a["gain"] = a["free_generation"]["gain"]
    a["gain_metric"] = "format_free" if "format_free_gain" in final else "free_generation"
    key = a["gain_metric"]
    a["baked_gain_validation"] = baked[f"{key}_gain"]
    return a


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
    from aegis.forge._quiet_logs import quiet_cognate_config_warning
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
    with quiet_cognate_config_warning():  # a Cognate config.json has auto_map: no remote code, no prompt
        tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
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
    hold_idx, val_idx, train_idx = split_rows(len(rows), settings.holdout, settings.validation)
    bake_ids, bake_mask = _pad([enc["bake"][i] for i in train_idx], pad)
    plain_ids, plain_mask = _pad([enc["plain"][i] for i in train_idx], pad)
    answers = sorted({tuple(a) for a in enc["answer"]})  # the task's valid answers, as token ids
    if len(answers) > settings.max_answers:
        answers = []
    test, val = _split_arrays(enc, hold_idx, pad, answers), _split_arrays(enc, val_idx, pad, answers)
    cands = None
    if answers:
        cands = np.full((len(answers), max(map(len, answers))), pad, np.int32)
        for c, a in enumerate(answers):
            cands[c, : len(a)] = a
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
    def answer_fn(p, mixer, ids, lens, ans, key):
        args = (ids, lens, ans, spec)
        w, pw, _ = core.answer_accuracy(model, p, mixer, *args, thoughts=True, rng=key, disallowed=thought_ids)
        wo, pwo, _ = core.answer_accuracy(model, p, mixer, *args, thoughts=False, rng=key, disallowed=thought_ids)
        return w, wo, pw, pwo

    @jax.jit
    def scores_fn(p, mixer, ids, lens, key):
        c = jnp.asarray(cands)
        sw, _ = core.answer_scores(model, p, mixer, ids, lens, c, spec, thoughts=True, rng=key)
        swo, _ = core.answer_scores(model, p, mixer, ids, lens, c, spec, thoughts=False, rng=key)
        return sw, swo

    @jax.jit
    def thoughts_fn(p, ids, lens, key):  # K sampled thoughts at the answer position of each row
        return sample_rows(p, ids, (lens - 1)[:, None], key)

    def evaluate(p, mixer, sp: dict[str, np.ndarray], key) -> dict[str, Any]:
        """Both ablations and the anti-theater metrics of ``(p, mixer)`` on one split's rows."""
        ids, lens = jnp.asarray(sp["ids"]), jnp.asarray(sp["len"])
        w, wo, pw, pwo = answer_fn(p, mixer, ids, lens, jnp.asarray(sp["ans"]), key)
        pw, pwo = np.asarray(pw), np.asarray(pwo)
        div = float(np.mean([core.edit_distance(a, b) / max(1, len(a)) for a, b in zip(pw, pwo)]))
        n_div = min(settings.diversity_rows, len(sp["len"]))
        rows = np.asarray(thoughts_fn(p, ids[:n_div], lens[:n_div], key))
        start = np.repeat(sp["len"][:n_div] - 1, spec.num_thoughts) + 2
        th = [r[s: s + T] for r, s in zip(rows, start)]
        stop = {end_id, pad, tok.eos_token_id}
        lens_t = [next((i for i, t in enumerate(x) if t in stop), T) for x in th]
        th = [list(x[:n]) for x, n in zip(th, lens_t)]
        k = spec.num_thoughts
        divs = [core.edit_distance(th[g * k + a], th[g * k + b]) for g in range(len(th) // k)
                for a in range(k) for b in range(a + 1, k)]
        res: dict[str, Any] = {"free_generation_with_thoughts": float(np.mean(w)),
                               "free_generation_without_thoughts": float(np.mean(wo))}
        res["free_generation_gain"] = res["free_generation_with_thoughts"] - res["free_generation_without_thoughts"]
        if cands is not None:
            sw, swo = scores_fn(p, mixer, ids, lens, key)
            res["format_free_with_thoughts"] = float(np.mean(np.argmax(np.asarray(sw), -1) == sp["truth"]))
            res["format_free_without_thoughts"] = float(np.mean(np.argmax(np.asarray(swo), -1) == sp["truth"]))
            res["format_free_gain"] = res["format_free_with_thoughts"] - res["format_free_without_thoughts"]
        res.update(divergence=div, thought_length=float(np.mean(lens_t)), diversity=float(np.mean(divs)))
        res["passed"] = bool(res["divergence"] >= settings.min_divergence
                             and res["thought_length"] >= settings.min_thought_length
                             and res["diversity"] >= settings.min_diversity)
        return res

    checks = lambda p, mixer, key: evaluate(p, mixer, val, key)  # noqa: E731 - validation rows only

    key = jax.random.key(settings.seed + 17)
    if not hist["checks"]:
        before = {"step": 0, **checks(st["baked"], st["mixer"], key)}
        hist["checks"].append({**before, "action": "baseline (baked)"})
        st["best"] = {"step": 0, "params": st["baked"], "mixer": st["mixer"], "score": selection_score(before)}
    if "best" not in st:  # a checkpoint written before model selection: the baked model is the first candidate
        st["best"] = {"step": 0, "params": st["baked"], "mixer": st["good"][1],
                      "score": selection_score(hist["checks"][0])}
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
            res = {"step": st["step"], **checks(st["params"], st["mixer"], key)}
            if res["passed"]:
                st["good"] = (st["params"], st["mixer"], st["opt"])
                res["action"] = "kept"
                if selection_score(res) > tuple(st["best"]["score"]):  # ties keep the earlier (the baked) model
                    st["best"] = {"step": st["step"], "params": st["params"], "mixer": st["mixer"],
                                  "score": selection_score(res)}
                    res["action"] = "kept; best on validation so far"
            else:  # theater: roll back to the last checkpoint that passed, tie the model closer to the baked one
                st["params"], st["mixer"], st["opt"] = st["good"]
                st["kl_coef"] = float(st["kl_coef"]) * 2.0 if float(st["kl_coef"]) > 0 else 0.1
                res["action"] = f"rolled back; kl {float(st['kl_coef']):g}"
            hist["checks"].append(res)
            gain = selection_score(res)[0]
            log(f"check at step {st['step']}: validation gain of thoughts {gain:+.3f}; anti-theater: divergence "
                f"{res['divergence']:.2f}, thought length {res['thought_length']:.1f}, diversity "
                f"{res['diversity']:.2f} -> {res['action']}")
        if st["step"] % settings.save_every == 0:
            save()

    # the test rows are scored once, on the model selected on the validation rows
    best = st["best"]
    sel_params, sel_mixer, sel_step = best["params"], best["mixer"], int(best["step"])
    final = evaluate(sel_params, sel_mixer, test, jax.random.key(settings.seed + 99))
    curve = [{k: c[k] for k in ("step", *_CURVE_KEYS, "passed", "action") if k in c} for c in hist["checks"]]
    before = hist["checks"][0]
    metric = "format_free_gain" if cands is not None else "free_generation_gain"
    if sel_step == 0:
        why = (f"kept the baked weights: no Quiet-STaR checkpoint that passed the anti-theater checks beat the baked "
               f"model's validation {metric} ({before[metric]:+.3f})" if settings.rl_steps else
               "kept the baked weights: no Quiet-STaR steps were run")
    else:
        why = f"Quiet-STaR step {sel_step} had the best validation {metric} ({hist_at(hist, sel_step)[metric]:+.3f})"
    log(f"selected {'the baked model' if sel_step == 0 else f'Quiet-STaR step {sel_step}'}: {why}")
    report = {
        "phase": "quietstar",
        "model": str(model_dir),
        "size_change": {**size.__dict__, "params_added": size.params_added},
        "tokens": list(THOUGHT_TOKENS),
        "rows": {"train": int(len(train_idx)), "validation": int(len(val_idx)), "held_out": int(len(hold_idx))},
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
        "selection": {"metric": f"validation {metric} (accuracy with thoughts - without); ties keep the higher "
                                "with-thoughts accuracy, then the earlier step", "validation_rows": int(len(val_idx)),
                      "selected_step": sel_step, "kept_baked": sel_step == 0, "reason": why, "curve": curve},
        "ablation": _ablation(final, before, test, answers, tok, sel_step),
        "seconds": round(time.time() - t_start, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    with output_dir(out / "model", overwrite=True, writer="aegis quietstar") as tmp:
        if getattr(model, "family", None) == "cognate":
            model.save(sel_params, tmp, tokenizer=tok)  # its own modeling code and config, as phase 1 exports
        else:
            save_checkpoint(model, sel_params, tmp)
            tok.save_pretrained(tmp)
        from aegis.train.safetensors_io import write_shards

        write_shards(tmp / "_mixer", {f"mixer.{k}": np.asarray(v, np.float32) for k, v in sel_mixer.items()})
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
    a, s, f, sel = r["ablation"], r["size_change"], r["anti_theater"]["final"], r["selection"]
    fg = a["free_generation"]
    lines = [
        "# Phase 3: Quiet-STaR", "",
        f"- tokens: +{s['tokens_added']} (vocab {s['vocab_before']} -> {s['vocab_after']}), "
        f"params {s['params_before']:,} -> {s['params_after']:,} (+{s['params_added']:,})",
        f"- rows: {r['rows']['train']} train, {r['rows']['validation']} validation (model selection), "
        f"{r['rows']['held_out']} test (scored once, on the selected model)",
        f"- baking: {r['bake']['steps']} steps, loss {r['bake']['first_loss']} -> {r['bake']['last_loss']}",
        f"- Quiet-STaR: {r['quietstar']['steps']} steps, {r['thought']['num_thoughts']} thoughts of "
        f"{r['thought']['length']} tokens, final KL coefficient {r['quietstar']['kl_coef_final']:g}",
        f"- selected: {'the baked model' if sel['kept_baked'] else 'Quiet-STaR step ' + str(sel['selected_step'])}"
        f" ({sel['reason']})",
        "", "Validation curve (gain of thoughts = accuracy with - without):", "",
        "| step | format-free with | without | gain | free-generation with | without | gain | checks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda c, k: f"{c[k]:.3f}" if k in c else "-"  # noqa: E731
    for c in sel["curve"]:
        lines.append(f"| {c['step']} | {fmt(c, 'format_free_with_thoughts')} | {fmt(c, 'format_free_without_thoughts')}"
                     f" | {fmt(c, 'format_free_gain')} | {fmt(c, 'free_generation_with_thoughts')} | "
                     f"{fmt(c, 'free_generation_without_thoughts')} | {fmt(c, 'free_generation_gain')} | "
                     f"{c.get('action', '')} |")
    lines += ["", f"Ablation on {a['held_out_rows']} held-out test rows:", ""]
    if "format_free" in a:
        ff = a["format_free"]
        lines.append(f"- format-free accuracy (the preferred answer among {len(a['answers'])} valid answers): with "
                     f"thoughts {ff['with_thoughts']:.3f}, without {ff['without_thoughts']:.3f}, gain "
                     f"{ff['gain']:+.3f}; chance {a['chance']:.3f}, majority answer {a['majority_baseline']:.3f}")
    lines += [f"- free-generation accuracy (greedy answer tokens, format included): with thoughts "
              f"{fg['with_thoughts']:.3f}, without {fg['without_thoughts']:.3f}, gain {fg['gain']:+.3f}",
              f"- anti-theater: divergence {f['divergence']:.2f}, thought length {f['thought_length']:.1f}, diversity "
              f"{f['diversity']:.2f} ({'passed' if f['passed'] else 'failed'}); rollbacks "
              f"{r['anti_theater']['rollbacks']}", ""]
    return "\n".join(lines)


def load_quietstar_model(folder: str | Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(quietstar.json, mixer params)`` of a phase-3 model folder, or None for any other folder."""
    folder = Path(folder)
    if not (folder / "quietstar.json").is_file():
        return None
    from safetensors.numpy import load_file

    mix = {k.removeprefix("mixer."): v for k, v in load_file(folder / "mixer.safetensors").items()}
    return json.loads((folder / "quietstar.json").read_text()), mix

