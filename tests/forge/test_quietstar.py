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


@pytest.fixture
def tiny_quietstar_model(tmp_path):
    from tools.hf_folders import make_model_folder

    return make_model_folder(tmp_path / "m", hidden=64, layers=2)


def test_thoughts_help_on_held_out_parity_and_theater_checks_roll_back(tiny_quietstar_model, tmp_path):
    """The bar: parity of 8 bits, whose running parities the thought writes; held-out rows are inputs never
    trained on. Prompt baking teaches the scratchpad, Quiet-STaR trains thoughts and the mixing head. A diversity
    threshold no deterministic scratchpad meets makes every check fail: each rolls back and doubles the KL."""
    from aegis.forge.quietstar import QuietStarSettings, parity_rows, run_quietstar

    settings = QuietStarSettings(bake_steps=300, bake_lr=3e-3, rl_steps=4, rl_lr=1e-3, check_every=2, batch_size=32,
                                 min_divergence=0.0, min_thought_length=1.0, min_diversity=1e9, kl_coef=0.1)
    report = run_quietstar(tiny_quietstar_model, parity_rows(256, bits=8), tmp_path / "out", settings)
    a = report["ablation"]
    assert a["held_out_rows"] == 64
    # the bar is a gain > 0; measured +0.41 (f1f137d) and +0.11 (7 of 64 rows) after the engine's attention and head
    # backward were rewritten (6f1baa0, 2e8ac50: same gradients to ~5e-7, another training trajectory)
    assert a["accuracy_with_thoughts"] - a["accuracy_without"] > 0.05, a
    checks = report["anti_theater"]["checks"]
    assert [c["step"] for c in checks] == [0, 2, 4]
    assert all(set(c) >= {"divergence", "thought_length", "diversity"} for c in checks)
    assert report["anti_theater"]["rollbacks"] == 2 and report["quietstar"]["kl_coef_final"] == pytest.approx(0.4)
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["ablation"]["gain"] == pytest.approx(a["gain"])
    assert (tmp_path / "out" / "model" / "mixer.safetensors").is_file()
    assert (tmp_path / "out" / "report.md").read_text().startswith("# Phase 3")


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
