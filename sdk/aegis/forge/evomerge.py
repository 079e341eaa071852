"""EvoMerge (Agent Forge phase 2): evolve merges of 2+ fine-tunes of one base into one better model.

    result = evomerge("evomerge.yml", "out/")     # EvoMergeResult: best combination, fitness, improvement
    # out/best/          the best model, a Hugging Face folder
    # out/report.json    out/report.txt    out/evolution.png (diversity and fitness per generation)
    # out/state/         state.json, fitness_cache.json, candidates/gen-000/*.yml, gen-001/, ... (resume after kill -9)

``aegis evomerge CONFIG.yml OUT`` is the same call. The config::

    base_model: ./base            # the model the fine-tunes were trained from
    models: [./ft-support, ./ft-billing]
    eval_data: ./held_out.jsonl   # text or chat rows, rendered with the base model's own tokenizer/template
    generations: 10
    population: 8
    seed: 0

The loop (the seed's, sized by ``population``): generation 0 is the 8 binary combinations of interpolation
(linear/slerp) x task arithmetic (DARE/TIES) x selection (frankenmerge/DFS) (:mod:`aegis.forge._evo_genome`
says how one candidate is built from three ``aegis merge`` configs). Each next generation keeps the
``elites`` fittest (chosen for diversity: an elite within cosine distance ``diverse_elite_distance`` of one
already chosen is passed over while others remain), adds mutated children of each elite, and two children
merged from the losers (the bottom ones, in two groups). Fitness (:func:`~aegis.forge._evo_fitness.composite_fitness`)
is the seed's size-adaptive composite of perplexity, next-token accuracy, speed and memory, each relative to the
parents' mean, cached by a hash of the merged weights. Diversity, the mean pairwise cosine distance of the
candidates' weight deltas from the base, is measured every generation; below ``low_diversity`` (the seed's 0.3)
the mutation rate doubles and, every ``inject_every`` generations, the last child is replaced by a random
combination. A merge with NaN/Inf or constant weight matrices, or a non-finite eval loss, is replaced by the
linear merge (the seed's fallback).

Evaluation uses the JAX engine (the model a run trains, loaded from the candidate's folder), one candidate
at a time; its batch size is the largest the planner's eval-peak estimate fits in 90% of the device's
memory, for the size read from the models' config at runtime. State is written atomically after every
generation: a run killed at any point resumes (``--resume``, or on its own when OUT/state exists) from the
last finished generation, with the same random state, so it ends where an uninterrupted run ends.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from aegis.errors import AegisError, InvalidConfigError
from aegis.forge._quiet_logs import quiet_cognate_config_warning
from aegis.schema import Frozen

__all__ = ["EvoMergeConfig", "EvoMergeResult", "load_evomerge_config", "evomerge"]

STATE_VERSION = 1


class EvoMergeConfig(Frozen):
    """An ``aegis evomerge`` config."""

    base_model: str = Field(description="The base model the fine-tunes share (folder or cached Hub id).")
    models: list[str] = Field(min_length=2, description="Two or more fine-tunes of base_model.")
    eval_data: str = Field(description="Held-out JSONL (text or chat rows) the fitness is measured on.")
    generations: int = Field(default=10, ge=0, le=10_000, description="Generations after generation 0.")
    population: int = Field(default=8, ge=8, le=1_000, description="Candidates per generation (8: the seed's; at least the 8 combinations).")
    seed: int = Field(default=0, description="Seed of every random choice (mutation, DARE masks, selection).")
    elites: int = Field(default=2, ge=1, le=499, description="Fittest candidates kept unchanged into the next generation.")
    mutation_rate: float = Field(default=0.1, gt=0, le=1, description="Bit-flip probability and std of parameter noise.")
    low_diversity: float = Field(default=0.3, ge=0, le=2, description="Diversity below which the seed's interventions start.")
    inject_every: int = Field(default=10, ge=1, le=10_000, description="With low diversity, inject a random combination every N generations.")
    diverse_elite_distance: float = Field(default=0.3, ge=0, le=2, description="Minimum cosine distance between elites (when possible).")
    seq_len: int = Field(default=512, ge=8, le=2**24, description="Eval rows are truncated to this many tokens.")
    max_eval_rows: int | None = Field(default=None, ge=1, description="Evaluate on the first N rows only (the seed's fast fitness).")

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [m["model"] if isinstance(m, Mapping) and "model" in m else m for m in v]
        return v

    @model_validator(mode="after")
    def _sizes(self) -> EvoMergeConfig:
        if self.elites * 2 + 2 > self.population:
            raise ValueError(f"population {self.population} is too small for {self.elites} elites, their children and 2 merged losers")
        if len(set(self.models)) != len(self.models):
            raise ValueError("models: a fine-tune is listed twice")
        return self


class EvoMergeResult(Frozen):
    """What an EvoMerge run produced."""

    out: Path = Field(description="The run folder.")
    best_model: Path = Field(description="The best model (Hugging Face folder).")
    best_combo: str = Field(description="Bits of the best candidate's combination, e.g. '100'.")
    best_combo_name: str = Field(description="e.g. 'slerp + dare + frankenmerge'.")
    best_fitness: float
    best_parent_fitness: float
    improvement: float = Field(description="best_fitness / best_parent_fitness - 1.")
    generations_run: int = Field(description="Generations finished (generation 0 included).")
    resumed_from: int | None = Field(default=None, description="Generation the run resumed after, if it resumed.")
    report: Path


def load_evomerge_config(source: str | Path | Mapping[str, Any]) -> EvoMergeConfig:
    """Parse an evomerge YAML (path or mapping); one-line InvalidConfigError naming the key at fault."""
    import yaml

    where = ""
    if isinstance(source, Mapping):
        data: Any = dict(source)
        root = None
    else:
        path = Path(source)
        where = f"{path.name}: "
        try:
            from aegis.forge.merge_config import _check_config_file

            _check_config_file(path, "evomerge config")
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise InvalidConfigError(f"cannot read {path} ({err.strerror or err}); check the path") from None
        except UnicodeDecodeError as err:
            raise InvalidConfigError(f"evomerge config {path} is not a text file (not UTF-8 at byte {err.start}): "
                                     "pass the evomerge YAML") from None
        except yaml.YAMLError as err:
            raise InvalidConfigError(f"{where}not valid YAML ({getattr(err, 'problem', None) or err})") from None
        root = path.resolve().parent
    if not isinstance(data, Mapping):
        raise InvalidConfigError(f"{where}an evomerge config is a mapping with base_model, models and eval_data")
    try:
        cfg = EvoMergeConfig.model_validate(data)
    except ValidationError as err:  # one line: the key, the value given and the accepted range
        from aegis._validation import validation_line

        raise InvalidConfigError(validation_line(err, where=where, model=EvoMergeConfig)) from None
    if root is not None:  # relative paths are relative to the YAML file
        def fix(p: str) -> str:
            q = Path(p).expanduser()
            return str(root / q) if not q.is_absolute() and (root / q).exists() else p

        cfg = cfg.model_copy(update={"base_model": fix(cfg.base_model), "models": [fix(m) for m in cfg.models],
                                     "eval_data": fix(cfg.eval_data)})
    return cfg


# ----- state ------------------------------------------------------------------------------------------


def _write_json(path: Path, data: Any) -> None:
    """Atomic: write a temporary file, fsync, rename over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fingerprint(cfg: EvoMergeConfig) -> dict[str, Any]:
    """The settings a resumed run must share with the run it continues (generations may grow)."""
    return cfg.model_dump(exclude={"generations"})


class _Run:
    def __init__(self, cfg: EvoMergeConfig, out: Path, log: Callable[[str], None]):
        self.cfg, self.out, self.log = cfg, out, log
        self.state_dir = out / "state"
        self.work = out / "work"
        self.cache: dict[str, dict[str, Any]] = {}
        self.combo_usage: Counter[str] = Counter()

    # -- sources and data

    def prepare(self) -> None:
        from aegis.train.safetensors_io import ModelWeights
        from aegis.forge.merge import _layout
        from aegis.models.source import locate_model
        from aegis.data.render import ChatRenderer
        from aegis.train.data import load_examples

        cfg = self.cfg
        sources = []
        for where, spec in [("base_model", cfg.base_model)] + [(f"models[{i}]", m) for i, m in enumerate(cfg.models)]:
            try:
                sources.append(locate_model(spec))
            except AegisError as err:
                raise InvalidConfigError(f"{where}: {err}") from None
        self.base = str(sources[0].folder)
        self.models = [str(s.folder) for s in sources[1:]]
        shapes: dict[str, tuple[str, dict[str, tuple[int, ...]]]] = {}
        for spec, src in zip([cfg.base_model, *cfg.models], sources, strict=True):
            w = ModelWeights(spec, src)
            arch = "/".join(w.config.get("architectures") or [str(w.config.get("model_type"))])
            shapes[spec] = (arch, {n: w.shape(n) for n in w.names})
            self.num_layers = len(_layout(w.names, spec).layers)
            self.config = w.config
            w.close()
        ref_arch, ref_shapes = shapes[cfg.base_model]
        for spec, (arch, sh) in shapes.items():
            if arch != ref_arch:
                raise InvalidConfigError(
                    f"{spec} is {arch} but base_model {cfg.base_model} is {ref_arch}: EvoMerge merges fine-tunes of one base"
                )
            if sh != ref_shapes:
                name = next((n for n in sorted(set(sh) | set(ref_shapes)) if sh.get(n) != ref_shapes.get(n)), "?")
                raise InvalidConfigError(
                    f"{spec} does not match base_model {cfg.base_model} at tensor {name} "
                    f"({sh.get(name)} vs {ref_shapes.get(name)}): EvoMerge merges fine-tunes of one base"
                )
        data = Path(cfg.eval_data).expanduser()
        if not data.is_file():
            raise InvalidConfigError(f"eval_data: {cfg.eval_data} does not exist; pass a held-out JSONL file (text or chat rows)")
        renderer = ChatRenderer.from_folder(self.base)
        examples, report = load_examples(str(data), renderer, seq_len=cfg.seq_len)
        if cfg.max_eval_rows:
            examples = examples[: cfg.max_eval_rows]
        self.data_report = report
        self.examples = examples

    def evaluator(self) -> Any:
        from aegis.forge._evo_fitness import Evaluator, plan_eval_batch

        batch = plan_eval_batch(self.config, self.cfg.seq_len, len(self.examples))
        self.eval_batch = batch
        return Evaluator(self.examples, seq_len=self.cfg.seq_len, batch_size=batch)

    # -- candidates

    def build(self, genome: Any, folder: Path, record: Path | None) -> None:
        import yaml

        from aegis.forge._evo_genome import merge_stages
        from aegis.forge.merge import merge_models

        scratch = folder.parent / f".{folder.name}.stages"
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
        scratch.mkdir(parents=True)
        try:
            stages = merge_stages(genome, self.base, self.models, scratch)
            for name, conf in stages:
                target = folder if name == "candidate" else scratch / name
                merge_models(conf, target, seed=genome.merge_seed)
            if record is not None:
                text = yaml.safe_dump({"genome": json.loads(genome.model_dump_json()),
                                       "merges": [{"output": n, "config": c} for n, c in stages]}, sort_keys=False)
                record.write_text(text.replace(str(scratch), "<work>"), encoding="utf-8")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def score(self, folder: Path, evaluator: Any) -> tuple[str, dict[str, Any]]:
        """(weights hash, cached entry with metrics) for the model in ``folder``."""
        from aegis.forge._evo_fitness import degenerate, weights_hash

        h = weights_hash(folder)
        if h in self.cache:
            return h, self.cache[h]
        problem = degenerate(folder)
        if problem is None:
            m = evaluator.evaluate(folder)
            if not math.isfinite(m.nll):
                problem = "the forward pass gives a non-finite loss"
            entry = {"metrics": json.loads(m.model_dump_json()), "problem": problem}
        else:
            entry = {"metrics": None, "problem": problem}
        self.cache[h] = entry
        return h, entry

    def fitness(self, entry: Mapping[str, Any]) -> float:
        from aegis.forge._evo_fitness import Metrics, composite_fitness

        if entry["metrics"] is None:
            return 0.0
        return composite_fitness(Metrics.model_validate(entry["metrics"]), self.ref, self.weights)

    def evaluate_generation(self, gen: int, genomes: list[Any], evaluator: Any, rng: Any) -> list[dict[str, Any]]:
        from aegis.forge._evo_genome import linear_fallback

        gen_dir = self.work / f"gen-{gen:03d}"
        rec_dir = self.state_dir / "candidates" / f"gen-{gen:03d}"
        shutil.rmtree(gen_dir, ignore_errors=True)
        gen_dir.mkdir(parents=True)
        rec_dir.mkdir(parents=True, exist_ok=True)
        out = []
        for i, g in enumerate(genomes):
            folder = gen_dir / f"cand-{i}"
            note = None
            try:
                self.build(g, folder, rec_dir / f"cand-{i}.yml")
                h, entry = self.score(folder, evaluator)
                if entry["problem"]:
                    note = entry["problem"]
            except AegisError as err:  # a merge the recipe cannot make: the seed's fallback as well
                note, h, entry = f"merge failed ({err})", None, None
            if note is not None:
                self.log(f"gen {gen} cand {i} ({g.combo}): {note}; falling back to linear")
                g = linear_fallback(len(self.models), self.num_layers, int(rng.integers(2**31)))
                self.build(g, folder, rec_dir / f"cand-{i}.yml")
                h, entry = self.score(folder, evaluator)
            f = self.fitness(entry)
            out.append({"genome": json.loads(g.model_dump_json()), "hash": h, "fitness": f, "folder": str(folder),
                        "fallback_reason": note})
            self.log(f"gen {gen} cand {i} {g.combo}: fitness {f:.4f}")
        return out

    def save(self, state: dict[str, Any]) -> None:
        _write_json(self.state_dir / "fitness_cache.json", self.cache)
        _write_json(self.state_dir / "state.json", state)


def _select_elites(pop: list[dict[str, Any]], dist: Any, k: int, min_dist: float) -> list[int]:
    """The seed's diversity-based selection: fittest first; skip a candidate within ``min_dist`` of a chosen
    elite (or with identical weights) while candidates remain that are not."""
    order = sorted(range(len(pop)), key=lambda i: -pop[i]["fitness"])
    chosen: list[int] = []
    for i in order:
        if len(chosen) == k:
            break
        if all(dist[i][j] >= min_dist and pop[i]["hash"] != pop[j]["hash"] for j in chosen):
            chosen.append(i)
    for i in order:  # not enough diverse ones: the fittest of the rest (distinct weights first)
        if len(chosen) == k:
            break
        if i not in chosen and all(pop[i]["hash"] != pop[j]["hash"] for j in chosen):
            chosen.append(i)
    for i in order:
        if len(chosen) == k:
            break
        if i not in chosen:
            chosen.append(i)
    return chosen


def _next_generation(run: _Run, pop: list[dict[str, Any]], dist: Any, gen: int, diversity: float, rng: Any
                     ) -> tuple[list[Any], dict[str, Any]]:
    from aegis.forge._evo_genome import Genome, merge_genomes, mutate, random_genome

    cfg = run.cfg
    low = diversity < cfg.low_diversity
    rate = cfg.mutation_rate * (2 if low else 1)
    elite_idx = _select_elites(pop, dist, cfg.elites, cfg.diverse_elite_distance)
    genomes = [Genome.model_validate(pop[i]["genome"]) for i in elite_idx]
    n_children = cfg.population - cfg.elites - 2
    for c in range(n_children):
        genomes.append(mutate(genomes[c % cfg.elites], rate, rng))
    ranked = sorted(range(len(pop)), key=lambda i: -pop[i]["fitness"])
    losers = [i for i in ranked if i not in elite_idx][-max(2, len(pop) - cfg.elites):]
    half = (len(losers) + 1) // 2
    for group in (losers[:half], losers[half:] or losers[:half]):
        genomes.append(merge_genomes([Genome.model_validate(pop[i]["genome"]) for i in group], rng))
    injected = False
    if low and gen % cfg.inject_every == 0:
        genomes[-1] = random_genome(len(run.models), run.num_layers, rng)
        injected = True
    return genomes, {"mutation_rate": rate, "injected_random": injected, "elites": elite_idx}


@quiet_cognate_config_warning()  # it loads the Cognate variants' tokenizers (no remote code) for every candidate
def evomerge(
    config: EvoMergeConfig | Mapping[str, Any] | str | Path,
    out: str | Path,
    *,
    resume: bool | None = None,
    log: Callable[[str], None] = lambda s: None,
    overwrite: bool = False,
) -> EvoMergeResult:
    """Run (or resume) an EvoMerge into folder ``out``. ``resume``: True requires OUT/state, False refuses
    to touch an existing run, None resumes when there is one. Raises InvalidConfigError (one line), and
    OutputPathError for a new run in a folder holding files Aegis did not write (unless ``overwrite``: they
    are kept) or one that cannot be created."""
    import numpy as np

    from aegis._outdir import check_output_dir
    from aegis.forge._evo_fitness import Metrics, diversity as measure_diversity, fitness_weights

    cfg = config if isinstance(config, EvoMergeConfig) else load_evomerge_config(config)
    out = Path(out).expanduser()
    run = _Run(cfg, out, log)
    state_file = run.state_dir / "state.json"
    ours = run.state_dir.is_dir()  # a run killed before its first checkpoint has state/ but no state.json yet
    if resume and not ours:
        raise InvalidConfigError(f"--resume: {out} holds no EvoMerge state (OUT/state); start the run without --resume")
    if resume is False and ours:
        raise InvalidConfigError(f"{out} already holds an EvoMerge run; resume it, or choose another OUT")
    if not ours:
        check_output_dir(out, overwrite=overwrite)
        if (out / "work").exists():  # the run's scratch folder, deleted when it ends
            raise InvalidConfigError(f"{out} holds work/, the folder an EvoMerge run uses as scratch and deletes; "
                                     "move it or choose another OUT")
    run.prepare()
    evaluator = run.evaluator()

    state: dict[str, Any]
    resumed_from = None
    if state_file.is_file():
        state = json.loads(state_file.read_text(encoding="utf-8"))
        if state.get("version") != STATE_VERSION or state.get("config") != json.loads(json.dumps(_fingerprint(cfg))):
            raise InvalidConfigError(
                f"{out} holds an EvoMerge run of a different config; use the same config (generations may grow) or another OUT"
            )
        cache_file = run.state_dir / "fitness_cache.json"
        run.cache = json.loads(cache_file.read_text(encoding="utf-8")) if cache_file.is_file() else {}
        resumed_from = state["generation"]
        log(f"resuming after generation {resumed_from}")
    else:
        run.state_dir.mkdir(parents=True, exist_ok=True)
        state = {"version": STATE_VERSION, "config": json.loads(json.dumps(_fingerprint(cfg))), "generation": -1}

    rng = np.random.default_rng(cfg.seed)
    if "rng" in state:
        rng.bit_generator.state = state["rng"]

    # the parents: the reference the fitness is normalised to
    if "parents" not in state:
        parents = []
        for m in run.models:
            h, entry = run.score(Path(m), evaluator)
            if entry["metrics"] is None:
                raise InvalidConfigError(f"{m}: {entry['problem']}; EvoMerge needs usable fine-tunes")
            parents.append({"model": m, "hash": h, "metrics": entry["metrics"]})
        state["parents"] = parents
    mets = [Metrics.model_validate(p["metrics"]) for p in state["parents"]]
    run.ref = Metrics(
        perplexity=float(np.mean([m.perplexity for m in mets])), accuracy=float(np.mean([m.accuracy for m in mets])),
        nll=float(np.mean([m.nll for m in mets])), tokens=mets[0].tokens,
        flops_per_token=float(np.mean([m.flops_per_token for m in mets])),
        weight_bytes=int(np.mean([m.weight_bytes for m in mets])), num_layers=mets[0].num_layers, eval_seconds=0.0,
    )
    run.size_category, run.weights = fitness_weights(run.ref.weight_bytes)
    for p in state["parents"]:
        p["fitness"] = run.fitness({"metrics": p["metrics"]})
    state.setdefault("history", [])

    from aegis.forge._evo_genome import Genome, initial_population, mutate

    if state["generation"] < 0:
        genomes = initial_population(len(run.models), run.num_layers, rng)  # the 8 combinations
        genomes += [mutate(genomes[i % 8], cfg.mutation_rate, rng) for i in range(cfg.population - 8)]
    else:
        genomes = [Genome.model_validate(g) for g in state["next"]]
    for gen in range(state["generation"] + 1, cfg.generations + 1):
        pop = run.evaluate_generation(gen, genomes, evaluator, rng)
        div, dist = measure_diversity([Path(c["folder"]) for c in pop], Path(run.base))
        fits = [c["fitness"] for c in pop]
        best = max(pop, key=lambda c: c["fitness"])
        if "best" not in state or best["fitness"] > state["best"]["fitness"]:
            state["best"] = {k: best[k] for k in ("genome", "hash", "fitness")}
            state["best"].update(generation=gen, metrics=run.cache[best["hash"]]["metrics"])
        genomes, actions = _next_generation(run, pop, dist.tolist(), gen, div, rng)
        if div < cfg.low_diversity:
            log(f"gen {gen}: low diversity {div:.3f} < {cfg.low_diversity}: mutation rate {actions['mutation_rate']:g}"
                + (", random combination injected" if actions["injected_random"] else ""))
        state["history"].append({
            "generation": gen, "best_fitness": max(fits), "mean_fitness": float(np.mean(fits)), "diversity": div,
            "combos": [c["genome"]["combo"] for c in pop], "fitnesses": fits,
            "fallbacks": sum(1 for c in pop if c["fallback_reason"]), **actions,
        })
        state["generation"] = gen
        state["next"] = [json.loads(g.model_dump_json()) for g in genomes]
        state["rng"] = rng.bit_generator.state
        run.save(state)
        prev = run.work / f"gen-{gen - 1:03d}"
        shutil.rmtree(prev, ignore_errors=True)
        log(f"gen {gen}: best {max(fits):.4f} mean {float(np.mean(fits)):.4f} diversity {div:.3f}")

    return _finish(run, state, resumed_from)


def _finish(run: _Run, state: dict[str, Any], resumed_from: int | None) -> EvoMergeResult:
    from aegis._outdir import output_dir
    from aegis.forge._evo_genome import Genome, combo_name

    out = run.out
    best = state["best"]
    genome = Genome.model_validate(best["genome"])
    with output_dir(out / "best", overwrite=True, writer="aegis evomerge") as tmp:  # a user's files in best/ stay
        run.build(genome, tmp, None)
    shutil.rmtree(run.work, ignore_errors=True)
    best_parent = max(state["parents"], key=lambda p: p["fitness"])
    usage = Counter(c for h in state["history"] for c in h["combos"])
    report = {
        "best": {"combo": genome.combo, "combo_name": combo_name(genome.combo), "fitness": best["fitness"],
                 "generation": best["generation"], "metrics": best["metrics"], "genome": best["genome"],
                 "weights_hash": best["hash"]},
        "best_parent": {"model": best_parent["model"], "fitness": best_parent["fitness"], "metrics": best_parent["metrics"]},
        "parents": state["parents"],
        "improvement": best["fitness"] / best_parent["fitness"] - 1 if best_parent["fitness"] > 0 else None,
        "combo_usage": dict(sorted(usage.items())),
        "fitness_weights": run.weights, "size_category": run.size_category,
        "eval": {"examples": len(run.examples), "batch_size": run.eval_batch, "seq_len": run.cfg.seq_len,
                 "engine": "aegis JAX engine (build_model + load_checkpoint)"},
        "history": state["history"], "resumed_from": resumed_from,
    }
    report["plot"] = _plot(state["history"], out / "evolution.png")
    _write_json(out / "report.json", report)
    (out / "report.txt").write_text(_text_report(report), encoding="utf-8")
    return EvoMergeResult(
        out=out, best_model=out / "best", best_combo=genome.combo, best_combo_name=combo_name(genome.combo),
        best_fitness=best["fitness"], best_parent_fitness=best_parent["fitness"],
        improvement=report["improvement"] if report["improvement"] is not None else 0.0,
        generations_run=state["generation"] + 1, resumed_from=resumed_from, report=out / "report.json",
    )


def _plot(history: list[dict[str, Any]], path: Path) -> str:
    """The diversity/fitness plot; without matplotlib, the line saying which extra installs it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'aegis-ml[forge]')"
    gens = [h["generation"] for h in history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(gens, [h["best_fitness"] for h in history], "o-", label="best fitness")
    ax.plot(gens, [h["mean_fitness"] for h in history], "s--", label="mean fitness")
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness (1.0 = parents' mean)")
    ax2 = ax.twinx()
    ax2.plot(gens, [h["diversity"] for h in history], "^:", color="tab:green", label="diversity")
    ax2.set_ylabel("diversity (mean cosine distance)")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [ln.get_label() for ln in lines], loc="best")
    ax.set_title("EvoMerge")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _text_report(r: dict[str, Any]) -> str:
    b, p = r["best"], r["best_parent"]
    bm, pm = b["metrics"], p["metrics"]
    imp = f"{r['improvement']:+.1%}" if r["improvement"] is not None else "n/a"
    lines = [
        f"EvoMerge: best {b['combo']} ({b['combo_name']}), generation {b['generation']}",
        f"fitness {b['fitness']:.4f} vs best parent {p['fitness']:.4f} ({p['model']}): {imp}",
        f"  perplexity {bm['perplexity']:.3f} vs {pm['perplexity']:.3f}; accuracy {bm['accuracy']:.4f} vs {pm['accuracy']:.4f}; "
        f"layers {bm['num_layers']} vs {pm['num_layers']}",
        f"fitness weights ({r['size_category']}): " + ", ".join(f"{k} {v:g}" for k, v in r["fitness_weights"].items()),
        f"eval: {r['eval']['examples']} examples, batch {r['eval']['batch_size']}, seq_len {r['eval']['seq_len']}",
        "combination usage: " + ", ".join(f"{k}: {v}" for k, v in r["combo_usage"].items()),
        "generation  best     mean     diversity  mutation  injected",
    ]
    for h in r["history"]:
        lines.append(f"{h['generation']:>10}  {h['best_fitness']:.4f}  {h['mean_fitness']:.4f}  {h['diversity']:.4f}"
                     f"     {h['mutation_rate']:<8g}  {'yes' if h['injected_random'] else 'no'}")
    lines.append(f"plot: {r['plot']}")
    return "\n".join(lines) + "\n"
