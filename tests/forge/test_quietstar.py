"""Phase 3 (Quiet-STaR): tokens and resize, reasoning rows (validation, pydantic-ai FunctionModel generation), the
thought rows' layout, and the bar: on held-out parity rows, thoughts raise accuracy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aegis.errors import DatasetError
from aegis.forge.quietstar import reasoning_data as qd


def test_validate_row_needs_both_markers_and_a_strategy():
    ok = {"prompt": "2+2=", "reasoning": "[thinking] <step> 2 and 2 [/endthinking]", "answer": "4"}
    assert qd.validate_row(ok).answer == "4"
    for bad in ({**ok, "reasoning": "<step> 2 and 2 [/endthinking]"}, {**ok, "reasoning": "[thinking] 4 [/endthinking]"},
                {**ok, "reasoning": "[/endthinking] <step> [thinking]"}, {"prompt": "x"}):
        with pytest.raises(DatasetError):
            qd.validate_row(bad)


def test_load_reasoning_names_the_bad_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps({"prompt": "a", "reasoning": "[thinking] <doubt> b [/endthinking]", "answer": "c"}) + "\n{oops\n")
    with pytest.raises(DatasetError, match="r.jsonl:2"):
        qd.load_reasoning(p)


def test_generate_reasoning_through_function_model_retries_bad_markers_and_stops_at_cost():
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    calls = []

    def reply(messages, info):
        calls.append(1)
        good = len(calls) % 2 == 0  # every other answer lacks the markers: validated, retried
        reasoning = "[thinking] <step> add the units [/endthinking]" if good else "just 4"
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"reasoning": reasoning, "answer": "4"})])

    sleeps = []
    rows, stats = qd.generate_reasoning(FunctionModel(reply), ["2+2?", "1+3?"], sleep=sleeps.append,
                                        limits=qd.GenerationLimits(requests_per_minute=600, usd_per_1k_tokens=1.0))
    assert [r.prompt for r in rows] == ["2+2?", "1+3?"] and stats["rejected"] == 2 and stats["requests"] == 4
    assert all(0 < s <= 0.1 for s in sleeps)  # paced at 600 per minute
    rows, stats = qd.generate_reasoning(FunctionModel(reply), ["a", "b", "c"],
                                        limits=qd.GenerationLimits(cost_limit_usd=1e-9, requests_per_minute=1e6))
    assert stats["stopped_at_cost_limit"] and stats["requests"] == 1


def test_add_thinking_tokens_grows_embeddings_and_head_from_existing_rows(tiny_quietstar_model):
    import jax
    from transformers import AutoTokenizer

    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    folder = tiny_quietstar_model
    tok = AutoTokenizer.from_pretrained(folder)
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    v0 = model.config["vocab_size"]
    spelled = tok.encode("thinking", add_special_tokens=False)
    new_model, new_params, size = qd.add_thinking_tokens(model, params, tok)
    assert size.tokens_added == 12 and size.vocab_after == v0 + 12 == len(tok)
    d = model.spec.hidden_size
    assert size.params_added == 12 * d * 2  # embedding and (untied) head rows, as the seed computes
    emb = np.asarray(new_params["model"]["embed_tokens"]["weight"])
    np.testing.assert_allclose(emb[tok.convert_tokens_to_ids("[thinking]")],
                               np.asarray(params["model"]["embed_tokens"]["weight"])[spelled].mean(0), rtol=1e-6)
    np.testing.assert_array_equal(emb[:v0], np.asarray(params["model"]["embed_tokens"]["weight"]))
    assert tok.encode("[thinking]<step>", add_special_tokens=False) == [v0, v0 + 2]
    logits = new_model.apply(new_params, np.array([[1, 2, v0 + 1]]))
    assert logits.shape == (1, 3, v0 + 12) and bool(jax.numpy.isfinite(logits).all())


def test_build_rows_puts_the_thought_after_each_position_and_the_true_tokens_after_it():
    from aegis.forge.quietstar.core import ThoughtSpec, build_rows

    spec = ThoughtSpec(start_id=90, end_id=91, pad_id=0, length=2, num_thoughts=1, n_true=2)
    x = np.array([[5, 6, 7, 8]])
    rows, pos = build_rows(x, np.array([[0, 2]]), spec)
    assert rows.tolist() == [[5, 90, 0, 0, 91, 6, 7, 0, 0, 0], [5, 6, 7, 90, 0, 0, 91, 8, 0, 0]]
    assert pos.tolist() == [0, 2]


class _Scripted:
    """A stand-in model whose next token depends only on the last token (``nxt[token]``): enough to script a thought."""

    def __init__(self, nxt: dict[int, int], vocab: int = 100) -> None:
        import jax.numpy as jnp

        table = np.zeros((vocab, vocab), np.float32)
        for a in range(vocab):
            table[a, nxt.get(a, 0)] = 10.0
        self.table, self.config = jnp.asarray(table), {"vocab_size": vocab}

    def hidden(self, params, rows):
        return self.table[rows]

    def head_weight(self, params):
        import jax.numpy as jnp

        return jnp.eye(self.config["vocab_size"])

    def project(self, h, w):
        return h @ w.T


def test_a_thought_the_model_ends_early_is_followed_by_the_true_tokens():
    """Baked thoughts are as long as their reasoning, so a model closes its thought before the T slots: the rows
    then read prompt, marker, the thought up to the model's own end marker, and the true tokens right after it (the
    tokens it would sample after its marker are dropped); a thought that runs to T keeps the forced marker."""
    import jax
    import jax.numpy as jnp

    from aegis.forge.quietstar.core import ThoughtSpec, build_rows, sample_thoughts, thought_ends

    spec = ThoughtSpec(start_id=90, end_id=91, pad_id=0, length=4, num_thoughts=1, n_true=2, banned=(90,))
    x = np.array([[5, 6, 7, 8]])
    rows, pos = build_rows(x, np.array([[0]]), spec)
    assert rows.tolist() == [[5, 90, 0, 0, 0, 0, 91, 6, 7, 0, 0, 0]]
    early = _Scripted({90: 40, 40: 41, 41: 91, 91: 42, 42: 43})  # thinks 40 41, then closes
    got = sample_thoughts(early, None, jnp.asarray(rows), jnp.asarray(pos), spec, jax.random.key(0), 0.0)
    assert got.tolist() == [[5, 90, 40, 41, 91, 6, 7, 0, 0, 0, 0, 0]]
    assert thought_ends(got, jnp.asarray(pos), spec).tolist() == [4]
    full = _Scripted({90: 40, 40: 41, 41: 42, 42: 43, 43: 44})  # never closes: four tokens, the forced marker
    got = sample_thoughts(full, None, jnp.asarray(rows), jnp.asarray(pos), spec, jax.random.key(0), 0.0)
    assert got.tolist() == [[5, 90, 40, 41, 42, 43, 91, 6, 7, 0, 0, 0]]
    assert thought_ends(got, jnp.asarray(pos), spec).tolist() == [6]


@pytest.fixture
def tiny_quietstar_model(tmp_path):
    from tools.hf_folders import make_model_folder

    return make_model_folder(tmp_path / "m", hidden=64, layers=2)


@pytest.mark.slow
def test_thoughts_help_on_held_out_parity_and_theater_checks_roll_back(tiny_quietstar_model, tmp_path):
    """The bar: parity of 8 bits, whose running parities the thought writes; the test rows are inputs never trained
    on nor used for selection. Prompt baking teaches the scratchpad, Quiet-STaR trains thoughts and the mixing head.
    A diversity threshold no deterministic scratchpad meets makes every check fail: each rolls back and doubles the
    KL, and model selection keeps the baked model (its mixing head still the initial one)."""
    from safetensors.numpy import load_file

    from aegis.forge.quietstar import QuietStarSettings, parity_rows, run_quietstar
    from aegis.forge.quietstar.run import select_step

    settings = QuietStarSettings(bake_steps=300, bake_lr=3e-3, rl_steps=4, rl_lr=1e-3, check_every=2, batch_size=32,
                                 min_divergence=0.0, min_thought_length=1.0, min_diversity=1e9, kl_coef=0.1)
    report = run_quietstar(tiny_quietstar_model, parity_rows(256, bits=8), tmp_path / "out", settings)
    a = report["ablation"]
    assert a["held_out_rows"] == 64 and report["rows"] == {"train": 160, "validation": 32, "held_out": 64}
    assert a["answers"] == [" 0", " 1"] and a["chance"] == 0.5 and a["gain_metric"] == "format_free"
    ff = a["format_free"]
    # the bar, on the answer rather than its format: measured 1.000 with thoughts vs 0.547 without (majority 0.547)
    assert ff["with_thoughts"] - ff["without_thoughts"] > 0.2, a
    assert ff["with_thoughts"] > max(a["chance"], a["majority_baseline"]) + 0.2, a
    assert set(a["free_generation"]) >= {"with_thoughts", "without_thoughts", "gain"}
    checks = report["anti_theater"]["checks"]
    assert [c["step"] for c in checks] == [0, 2, 4]
    assert all(set(c) >= {"divergence", "thought_length", "diversity", "format_free_gain"} for c in checks)
    assert report["anti_theater"]["rollbacks"] == 2 and report["quietstar"]["kl_coef_final"] == pytest.approx(0.4)
    sel = report["selection"]
    assert sel["selected_step"] == 0 and sel["kept_baked"] and "baked" in sel["reason"]
    assert [c["step"] for c in sel["curve"]] == [0, 2, 4] and select_step(sel["curve"]) == 0
    mixer = load_file(tmp_path / "out" / "model" / "mixer.safetensors")
    assert not mixer["mixer.w2"].any()  # the baked model's mixing head: zero-initialised, never trained
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["ablation"]["gain"] == pytest.approx(ff["gain"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# Phase 3") and "format-free accuracy" in md and "chance 0.500" in md


@pytest.mark.slow
def test_selection_keeps_the_weights_of_the_best_validation_checkpoint(tmp_path, monkeypatch):
    """With validation scores scripted so that Quiet-STaR step 2 of 4 is best, the saved model and mixing head are
    the weights checkpointed at step 2 (not the last step's), and the test rows are scored on them."""
    from safetensors.numpy import load_file
    from tools.hf_folders import make_model_folder

    from aegis.forge.quietstar import QuietStarSettings, parity_rows, run_quietstar
    from aegis.forge.quietstar import run as qrun

    folder = make_model_folder(tmp_path / "m", hidden=32, layers=2)
    settings = QuietStarSettings(bake_steps=3, bake_lr=3e-3, rl_steps=4, rl_lr=3e-2, check_every=2, batch_size=4,
                                 save_every=1, num_thoughts=2, min_diversity=0.0, min_divergence=0.0,
                                 min_thought_length=0.0)
    scripted = {0: (0.1, 0.5), 2: (0.3, 0.6), 4: (0.2, 0.9)}
    monkeypatch.setattr(qrun, "selection_score", lambda res: scripted[res["step"]])
    real_save, at = qrun._save_state, {}

    def record(path, state):
        if state["stage"] == "rl":
            at[state["step"]] = __import__("jax").device_get((state["params"], state["mixer"]))
        real_save(path, state)

    monkeypatch.setattr(qrun, "_save_state", record)
    report = run_quietstar(folder, parity_rows(32, bits=4), tmp_path / "out", settings)
    assert report["selection"]["selected_step"] == 2 and not report["selection"]["kept_baked"]
    assert report["ablation"]["selected_step"] == 2
    mixer = load_file(tmp_path / "out" / "model" / "mixer.safetensors")
    np.testing.assert_array_equal(mixer["mixer.w1"], np.asarray(at[2][1]["w1"]))
    assert not np.array_equal(np.asarray(at[2][1]["w1"]), np.asarray(at[4][1]["w1"]))  # the steps differ
    weights = load_file(tmp_path / "out" / "model" / "model.safetensors")
    np.testing.assert_array_equal(weights["model.embed_tokens.weight"],
                                  np.asarray(at[2][0]["model"]["embed_tokens"]["weight"]))


def test_quietstar_resumes_from_its_last_checkpoint_after_a_kill(tmp_path, monkeypatch):
    """Killed inside prompt baking (at the step-6 checkpoint, before it is written; the last one on disk is step 3)
    and re-run: the run starts from step 3, runs only the 6 steps the checkpoint lacks, and steps 4..6 redone give
    the losses the killed run had computed (the same batches from the same weights: the data order is in the
    checkpoint)."""
    from tools.hf_folders import make_model_folder

    from aegis.forge.quietstar import QuietStarSettings, parity_rows, run_quietstar
    from aegis.forge.quietstar import run as qrun

    folder = make_model_folder(tmp_path / "m", hidden=32, layers=2)
    rows = parity_rows(16, bits=4)
    settings = QuietStarSettings(bake_steps=9, bake_lr=3e-3, rl_steps=0, batch_size=4, save_every=3, num_thoughts=2,
                                 min_diversity=0.0, min_divergence=0.0, min_thought_length=0.0)
    real_save, saves, killed_losses = qrun._save_state, [], []

    def kill_at_step_6(path, state):
        saves.append(state["step"])
        if state["step"] == 6:
            killed_losses.extend(state["history"]["bake_loss"])
            raise KeyboardInterrupt  # as if kill -9 hit between the checkpoints at steps 3 and 6
        real_save(path, state)

    monkeypatch.setattr(qrun, "_save_state", kill_at_step_6)
    with pytest.raises(KeyboardInterrupt):
        run_quietstar(folder, rows, tmp_path / "out", settings)
    assert saves == [3, 6] and len(killed_losses) == 6 and not (tmp_path / "out" / "report.json").exists()
    monkeypatch.setattr(qrun, "_save_state", real_save)

    logs: list[str] = []
    report = run_quietstar(folder, rows, tmp_path / "out", settings, log=logs.append)
    assert "resuming phase 3 at bake step 3" in logs
    assert report["resumed_from"] == {"stage": "bake", "step": 3}
    assert report["steps_run"] == {"bake": 6, "rl": 0}  # steps 4..9: none of 1..3 again
    assert report["bake"]["steps"] == 9
    with (tmp_path / "out" / "state" / "quietstar.pkl").open("rb") as fh:
        losses = __import__("pickle").load(fh)["history"]["bake_loss"]
    assert len(losses) == 9 and losses[:6] == killed_losses  # 1..3 from the checkpoint, 4..6 recomputed equal


def test_split_rows_gives_disjoint_test_validation_and_train_rows():
    from aegis.forge.quietstar.run import split_rows

    test, val, train = split_rows(256, 0.25, 0.125)
    assert (len(test), len(val), len(train)) == (64, 32, 160)
    assert not set(test) & set(val) and not set(test) & set(train) and not set(val) & set(train)
    assert sorted([*test, *val, *train]) == list(range(256))
    with pytest.raises(DatasetError, match="none to train on"):
        split_rows(2, 0.25, 0.125)


def test_select_step_keeps_the_best_validation_checkpoint_and_the_baked_model_when_nothing_beats_it():
    from aegis.forge.quietstar.run import select_step

    def c(step, gain, with_=0.5, passed=True):
        return {"step": step, "format_free_gain": gain, "format_free_with_thoughts": with_, "passed": passed}

    assert select_step([c(0, 0.1), c(2, 0.3), c(4, 0.2)]) == 2
    assert select_step([c(0, 0.3, passed=False), c(2, 0.1), c(4, 0.3)]) == 0  # baked wins ties and ignores checks
    assert select_step([c(0, 0.1), c(2, 0.5, passed=False), c(4, 0.2)]) == 4  # a rolled-back checkpoint is no candidate
    assert select_step([c(0, 0.1, 0.5), c(2, 0.1, 0.7)]) == 2  # equal gain: the higher with-thoughts accuracy
    free = {"step": 0, "free_generation_gain": 0.0, "free_generation_with_thoughts": 0.2, "passed": True}
    assert select_step([free, {**free, "step": 3, "free_generation_gain": 0.1}]) == 3  # free-form answers


@pytest.mark.slow
def test_answer_scores_equal_a_direct_transformers_forward_pass(tmp_path):
    """The format-free scorer against a hand computation: transformers' forward pass of ``prompt + answer`` (no
    thought) and of ``prompt [thinking] thought [/endthinking] answer`` (the thought checked to be greedy), the
    mixing head applied by hand in numpy, log-likelihoods summed over each answer's tokens."""
    import jax
    import jax.numpy as jnp
    import torch
    from tools.hf_folders import make_model_folder
    from transformers import AutoModelForCausalLM

    from aegis.forge.quietstar import core
    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    folder = make_model_folder(tmp_path / "m", hidden=32, layers=2)
    config = json.loads((folder / "config.json").read_text())
    model = build_model(config)
    params = load_checkpoint(model, folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    pad, start, end, T = 0, 40, 41, 3
    spec = core.ThoughtSpec(start, end, pad, T, 1, 2, banned=(start,))
    prompts = np.asarray([[7, 8, 9, 10, 11], [12, 13, 14, 0, 0], [15, 16, 17, 18, 0]], np.int32)
    lengths = np.asarray([5, 3, 4], np.int32)
    cands = np.asarray([[50, 51], [52, pad], [53, 54]], np.int32)
    rng = np.random.default_rng(0)
    mixer = {"w1": rng.normal(size=(16, 64)).astype(np.float32) * 0.2, "b1": rng.normal(size=16).astype(np.float32),
             "w2": rng.normal(size=(1, 16)).astype(np.float32), "b2": np.asarray([0.3], np.float32)}
    args = (model, params, jax.tree.map(jnp.asarray, mixer), jnp.asarray(prompts), jnp.asarray(lengths),
            jnp.asarray(cands), spec)
    without, _ = core.answer_scores(*args, thoughts=False, rng=jax.random.key(0))
    with_, rows = core.answer_scores(*args, thoughts=True, rng=jax.random.key(0))

    def forward(ids):
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_hidden_states=True)
        return torch.log_softmax(out.logits[0], -1).numpy(), out.hidden_states[-1][0].numpy()

    for b in range(3):
        p = prompts[b, : lengths[b]].tolist()
        thought = p + [start]
        for _ in range(T):  # greedy, never the start marker or padding
            lp, _ = forward(thought)
            lp[-1, [start, pad]] = -np.inf
            thought.append(int(lp[-1].argmax()))
        assert np.asarray(rows)[b, len(p): len(p) + 1 + T].tolist() == thought[len(p):]
        for c in range(3):
            a = [t for t in cands[c].tolist() if t != pad]
            lp_base, h_base = forward(p + a)
            lp_post, h_post = forward(thought + [end] + a)
            plain = mixed = 0.0
            for m, t in enumerate(a):
                i, k = len(p) - 1 + m, len(thought) + m  # the positions predicting answer token m
                x = np.concatenate([h_base[i], h_post[k]])
                w = 1 / (1 + np.exp(-(np.maximum(mixer["w1"] @ x + mixer["b1"], 0) @ mixer["w2"][0] + mixer["b2"][0])))
                plain += lp_base[i, t]
                mixed += np.log(w * np.exp(lp_post[k, t]) + (1 - w) * np.exp(lp_base[i, t]))
            np.testing.assert_allclose(float(without[b, c]), plain, atol=1e-4)
            np.testing.assert_allclose(float(with_[b, c]), mixed, atol=1e-4)
