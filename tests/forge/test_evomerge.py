"""EvoMerge on two fine-tunes of one tiny Llama (trained here with torch on two text sets): the best model
beats the best parent on held-out data (its fitness, and its loss as transformers computes it), a run killed
with SIGKILL after a generation resumes and ends exactly where an uninterrupted run ends, and bad input is a
one-line error."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import typer
import yaml
from typer.testing import CliRunner

from aegis.errors import InvalidConfigError
from aegis.forge import evomerge, load_evomerge_config
from aegis.cli.forge import evomerge as evomerge_command
from tests.forge.evo_models import make_evo_models
from tests.hf_folders import make_model_folder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("jax")

GENERATIONS = 2  # generation 0 and two more

app = typer.Typer(add_completion=False)
app.command("evomerge")(evomerge_command)


@app.callback()
def _root() -> None:
    """A stand-in for the main `aegis` app."""


@pytest.fixture(scope="module")
def evo(tmp_path_factory) -> dict[str, Path]:
    return make_evo_models(tmp_path_factory.mktemp("evo-models"))


def _config(evo: dict[str, Path], **kw) -> dict:
    return {"base_model": str(evo["base"]), "models": [str(evo["support"]), str(evo["billing"])],
            "eval_data": str(evo["eval"]), "generations": GENERATIONS, "seed": 0, "seq_len": 64, **kw}


@pytest.fixture(scope="module")
def uninterrupted(evo, tmp_path_factory):
    out = tmp_path_factory.mktemp("evo-run") / "out"
    return evomerge(_config(evo), out), out


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _hf_nll(folder: Path, evo: dict[str, Path]) -> float:
    """Mean next-token NLL on the held-out rows, by transformers, on the ids the project's renderer makes."""
    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples

    examples, _ = load_examples(str(evo["eval"]), ChatRenderer.from_folder(evo["base"]), seq_len=64)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    total = count = 0.0
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor(ex.input_ids[None].astype(np.int64))
            logp = torch.log_softmax(model(ids).logits[0, :-1], -1)
            nll = -logp.gather(1, ids[0, 1:, None])[:, 0]
            mask = torch.tensor(ex.loss_mask[1:])
            total += float(nll[mask].sum())
            count += float(mask.sum())
    return total / count


def test_best_beats_the_best_parent_on_held_out_data(uninterrupted, evo):
    result, out = uninterrupted
    report = json.loads((out / "report.json").read_text())
    assert result.best_fitness > result.best_parent_fitness and result.improvement > 0
    # the engine's numbers are transformers' numbers, and the merged model is better than either parent
    best_nll = _hf_nll(out / "best", evo)
    parent_nll = {p["model"]: _hf_nll(Path(p["model"]), evo) for p in report["parents"]}
    assert math.isclose(report["best"]["metrics"]["nll"], best_nll, rel_tol=1e-4)
    for p in report["parents"]:
        assert math.isclose(p["metrics"]["nll"], parent_nll[p["model"]], rel_tol=1e-4)
    assert best_nll < min(parent_nll.values())
    # the report: the best combination, usage of the 8 combinations, history, the plot
    assert report["best"]["combo"] == result.best_combo and len(result.best_combo) == 3
    assert sum(report["combo_usage"].values()) == 8 * (GENERATIONS + 1)
    assert set(report["history"][0]["combos"]) == {format(i, "03b") for i in range(8)}
    assert [h["generation"] for h in report["history"]] == list(range(GENERATIONS + 1))
    assert all(0 <= h["diversity"] <= 2 for h in report["history"])
    best_per_gen = [h["best_fitness"] for h in report["history"]]
    assert best_per_gen == sorted(best_per_gen)  # elites are kept
    assert report["plot"].endswith("evolution.png") and (out / "evolution.png").read_bytes()[:4] == b"\x89PNG"
    text = (out / "report.txt").read_text()
    assert "best parent" in text and "combination usage" in text
    assert not (out / "work").exists() and (out / "state" / "candidates" / "gen-000").is_dir()


@pytest.mark.slow
def test_kill9_after_a_generation_resumes_to_the_same_end(uninterrupted, evo, tmp_path):
    result, ref_out = uninterrupted
    cfg_path = tmp_path / "evo.yml"
    cfg_path.write_text(yaml.safe_dump(_config(evo)))
    out = tmp_path / "out"
    state = out / "state" / "state.json"
    proc = subprocess.Popen([sys.executable, "-c", "from aegis.cli import main; main()", "evomerge", str(cfg_path),
                             str(out), "--quiet"], cwd=Path(__file__).parents[2], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while not state.is_file() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert state.is_file(), proc.stderr.read().decode() if proc.poll() is not None else "no checkpoint in time"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed_at = json.loads(state.read_text())["generation"]
    assert 0 <= killed_at < GENERATIONS  # killed mid-run, at a generation boundary or inside the next one

    resumed = evomerge(cfg_path, out, resume=True)
    assert resumed.resumed_from == killed_at
    assert resumed.best_fitness == result.best_fitness and resumed.best_combo == result.best_combo
    ref_hist = json.loads((ref_out / "report.json").read_text())["history"]
    hist = json.loads((out / "report.json").read_text())["history"]
    assert [(h["combos"], h["fitnesses"], h["diversity"]) for h in hist] == \
           [(h["combos"], h["fitnesses"], h["diversity"]) for h in ref_hist]
    # a finished run resumed again does nothing new
    again = evomerge(cfg_path, out)
    assert again.resumed_from == GENERATIONS and again.best_fitness == result.best_fitness


def test_cli_help_and_summary_line(uninterrupted, evo, tmp_path):
    result = CliRunner().invoke(app, ["evomerge", "--help"])
    assert result.exit_code == 0
    for word in ("CONFIG", "OUT", "--resume"):
        assert word in result.output
    _, out = uninterrupted
    cfg = tmp_path / "evo.yml"
    cfg.write_text(yaml.safe_dump(_config(evo)))
    result = CliRunner().invoke(app, ["evomerge", str(cfg), str(out), "--quiet"])  # finished: resumes, no new work
    assert result.exit_code == 0, result.output
    assert f"resumed after generation {GENERATIONS}" in result.output and "vs best parent" in result.output


def _one_line_error(cfg: dict | str, tmp_path: Path, *args: str) -> str:
    path = tmp_path / "evo.yml"
    path.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg))
    result = CliRunner().invoke(app, ["evomerge", str(path), str(tmp_path / "out"), *args])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_bad_key_is_one_line(evo, tmp_path):
    cfg = _config(evo)
    cfg["generaions"] = cfg.pop("generations")
    assert _one_line_error(cfg, tmp_path) == "error: evo.yml: unknown key 'generaions'; did you mean 'generations'?"


def test_missing_eval_data_is_one_line(evo, tmp_path):
    line = _one_line_error(_config(evo, eval_data=str(tmp_path / "nope.jsonl")), tmp_path)
    assert line.startswith("error: eval_data:") and "does not exist" in line


def test_mismatched_architectures_are_one_line(evo, tmp_path):
    other = make_model_folder(tmp_path / "mistral", model_type="mistral", layers=4)
    line = _one_line_error(_config(evo, models=[str(evo["support"]), str(other)]), tmp_path)
    assert "MistralForCausalLM" in line and "LlamaForCausalLM" in line and "fine-tunes of one base" in line
    wide = make_model_folder(tmp_path / "wide", hidden=32, layers=4)
    line = _one_line_error(_config(evo, models=[str(evo["support"]), str(wide)]), tmp_path)
    assert "does not match base_model" in line and "tensor" in line


def test_resume_without_state_and_small_population(evo, tmp_path):
    assert "holds no EvoMerge state" in _one_line_error(_config(evo), tmp_path, "--resume")
    with pytest.raises(InvalidConfigError, match="population 8 is too small for 4 elites"):
        load_evomerge_config(_config(evo, elites=4))
    with pytest.raises(InvalidConfigError, match="models"):
        load_evomerge_config(_config(evo, models=[str(evo["support"])]))


# ----- the parts, against their definitions ------------------------------------------------------------


def test_diversity_is_the_mean_pairwise_cosine_distance_of_the_deltas(evo, tmp_path):
    from scipy.spatial.distance import cosine

    from aegis.forge._evo_fitness import diversity
    from tests.forge.conftest import read_folder

    folders = [evo["support"], evo["billing"], evo["base"]]
    d, dist = diversity(folders, evo["base"])
    base = read_folder(evo["base"])
    flat = [np.concatenate([(read_folder(f)[k] - base[k]).ravel() for k in sorted(base)]).astype(np.float64)
            for f in folders[:2]]
    assert math.isclose(dist[0, 1], cosine(flat[0], flat[1]), rel_tol=1e-5)
    assert dist[0, 2] == dist[1, 2] == 1.0  # the base itself: no delta, orthogonal to everything
    assert math.isclose(d, (dist[0, 1] + 2.0) / 3, rel_tol=1e-9)


def test_degenerate_guard(evo, tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    from aegis.forge._evo_fitness import degenerate

    assert degenerate(evo["support"]) is None and degenerate(evo["base"]) is None  # norm weights of ones are fine
    for name, edit, why in [("nan", lambda t: t.__setitem__((0, 0), np.nan), "has NaN values"),
                            ("inf", lambda t: t.__setitem__((1, 2), np.inf), "has Inf values"),
                            ("flat", lambda t: t.fill(0.5), "has zero variance")]:
        dst = shutil.copytree(evo["support"], tmp_path / name)
        tensors = load_file(dst / "model.safetensors")
        edit(tensors["model.layers.1.mlp.up_proj.weight"])
        save_file(tensors, dst / "model.safetensors")
        assert degenerate(dst) == f"model.layers.1.mlp.up_proj.weight {why}"


def test_a_degenerate_candidate_falls_back_to_linear(evo, tmp_path, monkeypatch):
    import aegis.forge._evo_fitness as fitness

    real, calls = fitness.degenerate, []

    def first_candidate_is_broken(folder):
        calls.append(folder)
        return "model.norm.weight has NaN values" if len(calls) == 3 else real(folder)  # after the 2 parents

    monkeypatch.setattr(fitness, "degenerate", first_candidate_is_broken)
    out = tmp_path / "out"
    evomerge(_config(evo, generations=0), out)
    hist = json.loads((out / "report.json").read_text())["history"][0]
    assert hist["fallbacks"] == 1 and hist["combos"][0] == "000"
    record = yaml.safe_load((out / "state" / "candidates" / "gen-000" / "cand-0.yml").read_text())
    assert record["genome"]["fallback"] is True and record["merges"][0]["config"]["merge_method"] == "linear"


def test_genome_operators():
    from aegis.forge._evo_genome import combo_name, initial_population, merge_genomes, merge_stages, mutate

    rng = np.random.default_rng(0)
    pop = initial_population(2, 8, rng)
    assert [g.combo for g in pop] == [format(i, "03b") for i in range(8)]
    assert combo_name("101") == "slerp + dare + dfs"
    assert pop[0].layer_choice == (1, 1, 1, 1, 0, 0, 0, 0)
    assert pop[0].dfs_indicator == (1,) * 6 + (0, 0) + (0, 0) + (1,) * 6  # SOLAR: P[0, 6) then Q[2, 8)
    kids = [mutate(pop[0], 0.3, rng) for _ in range(20)]
    assert any(k.combo != "000" for k in kids) and any(k.layer_choice != pop[0].layer_choice for k in kids)
    assert all(0.01 <= w <= 1 for k in kids for w in k.linear_weights)
    assert all(0.05 <= d <= 1 for k in kids for d in k.densities)
    child = merge_genomes([pop[1], pop[3], pop[4]], rng)  # 001, 011, 100: per-bit majority 001
    assert child.combo == "001"
    stages = merge_stages(pop[7], "B", ["A1", "A2"], Path("/w"))
    assert [(n, c["merge_method"]) for n, c in stages] == [("interp", "slerp"), ("task", "ties"), ("candidate", "dfs")]
    assert [(n, c["merge_method"]) for n, c in merge_stages(pop[0], "B", ["A1", "A2"], Path("/w"))] == [
        ("interp", "linear"), ("task", "dare_linear"), ("candidate", "passthrough")]


def test_fitness_weights_follow_the_size_and_the_plot_names_its_extra(tmp_path, monkeypatch):
    from aegis.forge._evo_fitness import Metrics, composite_fitness, fitness_weights
    from aegis.forge.evomerge import _plot

    assert fitness_weights(50 * 10**6) == ("tiny", {"perplexity": 0.5, "accuracy": 0.3, "speed": 0.1, "memory": 0.1})
    assert fitness_weights(500 * 10**6)[0] == "small" and fitness_weights(2 * 10**9)[0] == "large"
    ref = Metrics(perplexity=10, accuracy=0.5, nll=math.log(10), tokens=100, flops_per_token=1e6, weight_bytes=1000,
                  num_layers=4, eval_seconds=1)
    w = fitness_weights(1000)[1]
    assert math.isclose(composite_fitness(ref, ref, w), 1.0)
    better = ref.model_copy(update={"perplexity": 5.0, "accuracy": 0.6})
    assert math.isclose(composite_fitness(better, ref, w), 0.5 * 2 + 0.3 * 1.2 + 0.1 + 0.1)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert _plot([], tmp_path / "x.png") == "no plot: matplotlib is not installed (pip install 'aegis-ml[forge]')"


def test_eval_batch_comes_from_the_planner(evo):
    from aegis.forge._evo_fitness import plan_eval_batch
    from aegis.planning.memory.estimate import estimate_memory
    from aegis.models.profiles import profile_from_config

    config = json.loads((evo["base"] / "config.json").read_text())
    profile = profile_from_config(config, model_id="t", source="path")

    def peak(b):
        return estimate_memory(profile, method="full", framework="jax", precision="fp32", micro_batch_size=1,
                               seq_len=64, eval_batch_size=b, eval_seq_len=64).eval_peak_bytes

    assert plan_eval_batch(config, 64, 100, budget_bytes=peak(8)) == 8
    assert plan_eval_batch(config, 64, 100, budget_bytes=peak(8) - 1) == 4
    assert plan_eval_batch(config, 64, 5, budget_bytes=10**15) == 4  # never more than the examples
    assert plan_eval_batch(config, 64, 100, budget_bytes=0) == 1


def test_low_diversity_doubles_mutation_injects_and_keeps_distinct_elites(evo):
    from types import SimpleNamespace

    from aegis.forge._evo_genome import initial_population
    from aegis.forge.evomerge import _next_generation

    cfg = load_evomerge_config(_config(evo))
    run = SimpleNamespace(cfg=cfg, models=["a", "b"], num_layers=4)
    rng = np.random.default_rng(0)
    genomes = initial_population(2, 4, rng)
    pop = [{"genome": json.loads(g.model_dump_json()), "fitness": f, "hash": h}
           for g, f, h in zip(genomes, [5, 9, 9, 1, 2, 3, 4, 8], ["x", "dup", "dup", "a", "b", "c", "d", "e"])]
    far = np.ones((8, 8)) - np.eye(8)
    nxt, actions = _next_generation(run, pop, far.tolist(), gen=3, diversity=0.5, rng=rng)
    assert len(nxt) == 8 and actions == {"mutation_rate": 0.1, "injected_random": False, "elites": [1, 7]}
    assert [g.combo for g in nxt[:2]] == ["001", "111"]  # the elites, unchanged; the twin of 'dup' passed over
    close = np.zeros((8, 8))
    nxt, actions = _next_generation(run, pop, close.tolist(), gen=10, diversity=0.1, rng=rng)
    assert actions["mutation_rate"] == 0.2 and actions["injected_random"] is True
    assert actions["elites"] == [1, 7]  # nothing is diverse: the fittest with distinct weights


def test_ste_train_batch_comes_from_the_planner(evo):
    """BitNet's STE run (and any forge training step) sizes its micro batch with the planner's JAX estimate."""
    from aegis.forge._evo_fitness import plan_train_batch
    from aegis.planning.memory.estimate import estimate_memory
    from aegis.models.profiles import profile_from_config

    config = json.loads((evo["base"] / "config.json").read_text())
    profile = profile_from_config(config, model_id="t", source="path")

    def peak(b):
        return estimate_memory(profile, method="full", framework="jax", precision="fp32", micro_batch_size=b,
                               seq_len=64).tensor_bytes

    assert peak(4) > peak(2)
    assert plan_train_batch(config, 64, 8, budget_bytes=peak(4)) == 4
    assert plan_train_batch(config, 64, 8, budget_bytes=peak(4) - 1) == 2
    assert plan_train_batch(config, 64, 8, budget_bytes=10**15) == 8  # never above the cap
