"""``aegis forge CONFIG.yml OUT``: phases 1 -> 2 -> 3 -> 4 of the seed, each sized at run time.

    from aegis.forge.pipeline import run_forge, tiny_config
    run_forge(tiny_config(), "out/")           # what `aegis forge --tiny out/` runs (CPU, bundled data)

OUT/phase1_cognate/ (three Cognate models, :func:`aegis.forge.cognate.run_phase1`), OUT/phase2_evomerge/ (EvoMerge of
the three, their memories first zero-padded to one slot count), OUT/phase3_quietstar/ (Quiet-STaR on the merged
model), OUT/phase4_bitnet/ (BitNet b1.58: ternary-aware fine-tuning of a Cognate model, then packing, measured as
served: :func:`aegis.forge.cognate.ternary.run_phase4`), each with ``report.json`` and ``report.md``; OUT/final is
the compressed model. A phase that finished writes ``.complete``; re-running the command skips finished phases and
resumes the unfinished one from its own state (EvoMerge's generations, Quiet-STaR's steps, phase 4's fine-tuning
steps). Every phase reads its input model's size from the files it gets.

Config (YAML): ``phase1`` (passed to ``run_phase1``), ``phase2`` (EvoMerge fields: generations, population,
eval_data, ...), ``phase3`` (``data``: reasoning JSONL, or ``parity`` for the bundled task; plus
:class:`~aegis.forge.quietstar.QuietStarSettings` fields), ``phase4``
(:class:`~aegis.forge.cognate.ternary.Phase4Settings`: ``steps`` (0: pack only), ``lr``, ``warmup``, ``kl_coef``,
``per_channel``, ``scale_dtype``, ...).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from aegis.errors import InvalidConfigError

__all__ = ["PHASES", "run_forge", "tiny_config", "load_forge_config", "model_size"]

PHASES = ("phase1_cognate", "phase2_evomerge", "phase3_quietstar", "phase4_bitnet")


def tiny_config() -> dict[str, Any]:
    """Toy scale for a CPU: tiny Cognate models, one EvoMerge generation, the bundled parity task (8 rows a step:
    a Cognate step runs its three passes and the memory scan, several times a plain decoder's cost). Baking stops
    once the mean loss of 20 steps is <= 0.03 (600 at most). Phase 3 selects its model on 32 validation rows
    and scores the 64 test rows once. Measured (`aegis forge --tiny`, cold compile cache, 9:51 on a loaded 2-core
    CPU): format-free accuracy 0.812 with thoughts vs 0.453 without (+0.359; chance 0.5, majority answer 0.547),
    the baked model kept (the Quiet-STaR steps' validation gains +0.281 at step 3 and +0.188 at 6 were below its
    +0.312). Phase 4 fine-tunes the ternary model 60 steps (straight-through, CE on phase 3's rows + KL to the
    phase-3 model) before packing: top-1 agreement of the served packed model with phase 3 on the test rows 0.695
    compress-only -> 0.920, KL 1.19 -> 0.16, accuracy with thoughts 0.281 -> 0.672 (without: 0.734 -> 0.453).
    Tried for phase 4 on those rows: lr 3e-3 (agreement 0.943, with thoughts 0.516), KL weight 3 (0.921, 0.594)."""
    return {
        "tiny": True,
        "phase1": {},
        "phase2": {"generations": 1, "population": 8, "max_eval_rows": 16, "seq_len": 64},
        "phase3": {"data": "parity", "rows": 256, "bake_steps": 600, "bake_target_loss": 0.03, "bake_lr": 3e-3,
                   "rl_steps": 6, "batch_size": 8, "rl_lr": 1e-3, "check_every": 3, "min_diversity": 0.0,
                   "min_divergence": 0.0, "min_thought_length": 1.0},
        "phase4": {"steps": 60, "lr": 1e-3, "warmup": 10, "batch_size": 8},
    }


def load_forge_config(path: str | Path) -> dict[str, Any]:
    """The YAML at ``path`` as a dict (sections phase1..phase4, each optional)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise InvalidConfigError(f"{path} is not a file: pass a forge YAML (phase1..phase4 sections) or use --tiny")
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise InvalidConfigError(f"{path} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(cfg, dict) or set(cfg) - {"tiny", "phase1", "phase2", "phase3", "phase4"}:
        raise InvalidConfigError(f"{path}: the top level holds phase1, phase2, phase3, phase4 (and tiny)")
    return cfg


def model_size(folder: str | Path) -> dict[str, Any]:
    """Parameters and bytes of the safetensors files in ``folder``, read from their headers."""
    from aegis.train.safetensors_io import read_header

    params = nbytes = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        header, _ = read_header(f)
        for name, t in header.items():
            if name == "__metadata__":
                continue
            n = 1
            for d in t["shape"]:
                n *= d
            params += n
            nbytes += t["data_offsets"][1] - t["data_offsets"][0]
    return {"params": params, "bytes": nbytes}


def _done(folder: Path) -> dict[str, Any] | None:
    marker = folder / ".complete"
    return json.loads(marker.read_text()) if marker.is_file() else None


def _finish(folder: Path, report: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    (folder / "report.json").write_text(json.dumps(report, indent=2, default=str))
    if not (folder / "report.md").exists() or report.get("phase") not in ("quietstar", "bitnet"):  # their own
        lines = [f"# {folder.name}", ""] + [f"- {k}: {v}" for k, v in report.items() if not isinstance(v, (dict, list))]
        (folder / "report.md").write_text("\n".join(lines) + "\n")
    (folder / ".complete").write_text(json.dumps(outputs, default=str))
    return outputs


FORGE_MARKER = ".aegis-forge"
"""Written first into OUT: a re-run resumes there instead of treating the phases as a stranger's files."""


def run_forge(config: dict[str, Any], out: str | Path, *, log: Callable[[str], None] = lambda s: None,
              run_phase1: Callable[..., list[Path]] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Run (or resume) the four phases into ``out``; returns ``{phase: outputs}`` and writes OUT/final.
    ``run_phase1`` replaces :func:`aegis.forge.cognate.run_phase1` (tests). A folder that holds files and is not
    an earlier forge run's (no ``.aegis-forge`` marker) is refused without ``overwrite`` (the output-folder rule)."""
    from aegis._outdir import check_output_dir

    out = Path(out)
    marker = out / FORGE_MARKER
    if out.is_dir() and any(out.iterdir()) and not marker.exists():
        check_output_dir(out, overwrite=overwrite)
    out.mkdir(parents=True, exist_ok=True)
    marker.touch()
    tiny = bool(config.get("tiny", False))
    results: dict[str, Any] = {}

    # ----- phase 1: three Cognate models -----
    p1 = out / PHASES[0]
    if (done := _done(p1)) is None:
        log("phase 1: Cognate (3 models)")
        t = time.time()
        if run_phase1 is None:
            from aegis.forge.cognate import run_phase1
        p1.mkdir(exist_ok=True)
        models = [Path(m) for m in run_phase1(dict(config.get("phase1") or {}), p1 / "models", tiny=tiny)]
        if len(models) != 3:
            raise InvalidConfigError(f"phase 1 returned {len(models)} models, expected 3")
        sizes = {m.name: model_size(m) for m in models}
        done = _finish(p1, {"phase": "cognate", "models": [str(m) for m in models], "sizes": sizes,
                            "seconds": round(time.time() - t, 1)}, {"models": [str(m) for m in models]})
    else:
        log("phase 1: done (skipped)")
    results[PHASES[0]] = done

    # ----- phase 2: EvoMerge the three -----
    p2 = out / PHASES[1]
    if (done := _done(p2)) is None:
        from aegis.forge.evomerge import evomerge

        log("phase 2: EvoMerge")
        t = time.time()
        models = results[PHASES[0]]["models"]
        inputs, aligned = _align_memory(models, p2 / "inputs", log)
        section = dict(config.get("phase2") or {})
        if "eval_data" not in section:
            section["eval_data"] = str(_bundled_eval(out / "data"))
        section.setdefault("base_model", inputs[0])
        section.setdefault("models", inputs[1:] if section["base_model"] == inputs[0] else inputs)
        r = evomerge(section, p2 / "run", resume=None, log=log)
        report = {"phase": "evomerge", "input_sizes": {Path(m).name: model_size(m) for m in models},
                  "memory_padding": aligned,
                  "best_model": str(r.best_model), "best_combo": f"{r.best_combo} ({r.best_combo_name})",
                  "best_fitness": r.best_fitness, "best_parent_fitness": r.best_parent_fitness,
                  "improvement": r.improvement, "generations_run": r.generations_run,
                  "output_size": model_size(r.best_model), "seconds": round(time.time() - t, 1)}
        done = _finish(p2, report, {"model": str(r.best_model)})
    else:
        log("phase 2: done (skipped)")
    results[PHASES[1]] = done

    # ----- phase 3: Quiet-STaR -----
    p3 = out / PHASES[2]
    if (done := _done(p3)) is None:
        from aegis.forge.quietstar import run_quietstar

        log("phase 3: Quiet-STaR")
        src = results[PHASES[1]]["model"]
        rows, settings = _phase3_rows(config)
        report = run_quietstar(src, rows, p3, settings, log=log)
        report["input_size"] = model_size(src)
        report["output_size"] = model_size(p3 / "model")
        done = _finish(p3, report, {"model": str(p3 / "model")})
    else:
        log("phase 3: done (skipped)")
    results[PHASES[2]] = done

    # ----- phase 4: BitNet b1.58 -----
    p4 = out / PHASES[3]
    if (done := _done(p4)) is None:
        from aegis.forge.cognate.ternary import Phase4Settings, run_phase4

        log("phase 4: BitNet b1.58")
        src = Path(results[PHASES[2]]["model"])
        rows, qs = _phase3_rows(config)
        report = run_phase4(src, rows, p4, Phase4Settings(**dict(config.get("phase4") or {})),
                            holdout=qs.holdout, validation=qs.validation, log=log)
        report["input_size"] = model_size(src)
        done = _finish(p4, report, {"model": str(p4 / "model")})
    else:
        log("phase 4: done (skipped)")
    results[PHASES[3]] = done

    final = out / "final"
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(results[PHASES[3]]["model"], final)
    (out / "report.json").write_text(json.dumps(results, indent=2, default=str))
    return results


def _phase3_rows(config: dict[str, Any]) -> tuple[list[Any], Any]:
    """Phase 3's reasoning rows and settings from the config (phase 4 fine-tunes and measures on the same rows)."""
    from aegis.forge.quietstar import QuietStarSettings, load_reasoning, parity_rows

    section = dict(config.get("phase3") or {})
    data = section.pop("data", "parity")
    n_rows = section.pop("rows", 256)
    rows = parity_rows(n_rows) if data == "parity" else load_reasoning(data)
    return rows, QuietStarSettings(**section)


def _align_memory(models: list[str], folder: Path, log: Callable[[str], None]) -> tuple[list[str], dict[str, Any]]:
    """EvoMerge's inputs: Cognate variants whose long-term memories differ in slots (the seed's 2048 / 8192) are
    copied into ``folder`` with their memory zero-padded to the largest count
    (:func:`aegis.forge.cognate.hf_folder.widen_memory`: inactive slots, the same logits), so the three merge tensor by
    tensor; any other model goes in as it is (EvoMerge still refuses real shape mismatches). Returns the input
    folders and ``{name: {"ltm_slots": own, "padded_to": largest}}`` for the padded ones."""
    from aegis.forge.cognate.hf_folder import memory_slots, widen_memory

    slots = {m: memory_slots(m) for m in models}
    if None in slots.values() or len(set(slots.values())) == 1:
        return list(models), {}
    top = max(s for s in slots.values() if s is not None)
    inputs, aligned = [], {}
    for m in models:
        if slots[m] == top:
            inputs.append(m)
            continue
        name = Path(m).name
        dst = widen_memory(m, folder / name, top)  # atomic; a re-run rewrites the same bytes
        log(f"  {name}: memory {slots[m]} -> {top} slots (the added slots are zero and stay inactive)")
        aligned[name] = {"ltm_slots": slots[m], "padded_to": top}
        inputs.append(str(dst))
    return inputs, aligned


def _bundled_eval(folder: Path) -> Path:
    """Held-out text rows for EvoMerge's fitness: the bundled parity task, written as JSONL."""
    from aegis.forge.quietstar import parity_rows

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "eval.jsonl"
    if not path.exists():
        rows = parity_rows(64, seed=1)
        path.write_text("".join(json.dumps({"text": r.prompt + r.answer}) + "\n" for r in rows))
    return path
