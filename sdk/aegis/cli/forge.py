"""``aegis merge CONFIG.yml OUT``: merge models from a mergekit YAML into a Hugging Face folder.

Mount the command function on a typer app: ``app.command("merge")(merge)``. Errors Aegis raises
on purpose print one line and exit 2, whether mounted on the main app or driven alone (tests use
typer's ``CliRunner``). Imports nothing heavy until the command runs.

    aegis merge merge.yml ./merged
    aegis merge merge.yml ./merged --seed 0 --max-shard-size 2GB --overwrite

Every command here writes its folder as :mod:`aegis._outdir` does: a folder holding files Aegis did not write
is refused without ``--overwrite``; with it, files of the same name are replaced and the others kept.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer

__all__ = ["merge", "compress", "evomerge", "quietstar", "reasoning", "forge", "generate", "cognate", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """'5GB' -> 5e9, '2GiB' -> 2**31, '500MB', '1000000' -> bytes (transformers' ``max_shard_size`` style)."""
    m = _SIZE.match(text)
    unit = (m.group(2) or "").lower().removesuffix("b") if m else ""
    if m is None or unit not in _UNITS:
        raise typer.BadParameter(f"{text!r} is not a size; write e.g. 5GB, 2GiB or 500MB")
    return int(float(m.group(1)) * _UNITS[unit])


def merge(
    config: Annotated[Path, typer.Argument(
        metavar="CONFIG.yml", help="mergekit YAML: merge_method, base_model, models or slices, parameters.")],
    out: Annotated[Path, typer.Argument(
        metavar="OUT", help="Folder to write the merged model to (config, safetensors, tokenizer).")],
    seed: Annotated[Optional[int], typer.Option(
        min=0, max=2**63 - 1, help="Seed of DARE's random drop masks (reproducible merges).")] = None,
    max_shard_size: Annotated[str, typer.Option(help="Largest safetensors shard, e.g. 5GB, 2GiB, 500MB.")] = "5GiB",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Write into OUT even if it holds files.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Merge models as mergekit does: linear, slerp, task_arithmetic, ties, dare_ties, dare_linear, passthrough;
    and dfs (a data-flow-space layer path with input scaling, written as a plain model folder)."""
    from rich.console import Console

    from aegis.errors import AegisError

    shard_bytes = parse_size(max_shard_size)
    console = Console(stderr=True)
    try:
        from aegis.forge.merge import merge_models

        if quiet:
            result = merge_models(config, out, seed=seed, max_shard_bytes=shard_bytes, overwrite=overwrite)
        else:
            from rich.progress import (
                BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
            )

            progress = Progress(
                TextColumn("[bold]merging[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("tensors"),
                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("[dim]{task.fields[name]}"),
                console=console, transient=True,
            )
            tasks: list = []

            def on_tensor(done: int, total: int, name: str) -> None:
                if not tasks:  # started once the plan is checked, so an error prints alone
                    progress.start()
                    tasks.append(progress.add_task("merge", total=total, name=""))
                progress.update(tasks[0], completed=done, name=name)

            try:
                result = merge_models(
                    config, out, seed=seed, max_shard_bytes=shard_bytes, overwrite=overwrite, on_tensor=on_tensor
                )
            finally:
                if tasks:
                    progress.stop()
    except AegisError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except ImportError as err:
        from aegis._extras import missing_extra

        typer.echo(f"error: {missing_extra(err, '`aegis merge`')}", err=True)
        raise typer.Exit(2) from None
    for line in result.warnings:
        console.print(f"[yellow]warning:[/] {line}", highlight=False)
    shards = f"{len(result.shards)} shard{'s' if len(result.shards) > 1 else ''}"
    typer.echo(
        f"merged ({result.merge_method}): {result.num_layers} layers, {result.tensors} tensors, {shards}, "
        f"{result.total_bytes / 2**20:.1f} MiB -> {result.out}"
    )


def compress(
    src: Annotated[Path, typer.Argument(metavar="SRC", help="Hugging Face model folder (config.json, safetensors).")],
    out: Annotated[Path, typer.Argument(metavar="OUT", help="Folder for the packed BitNet b1.58 model.")],
    per_channel: Annotated[bool, typer.Option("--per-channel", help="One absmean scale per output channel.")] = False,
    scale_dtype: Annotated[str, typer.Option(help="How the scales are stored: float32 or bfloat16.")] = "float32",
    keep_layer: Annotated[Optional[list[int]], typer.Option(
        "--keep-layer", min=0, max=9_999, help="Decoder layer kept in full precision (repeatable; without --data).")] = None,
    data: Annotated[Optional[str], typer.Option(
        help="Calibration data (any format `aegis plan` reads): eval before/after, layer-wise revert, report.")] = None,
    samples: Annotated[Optional[int], typer.Option(min=1, max=10_000_000, help="Calibration rows (default: the size category's).")] = None,
    seq_len: Annotated[int, typer.Option(min=2, max=2**24, help="Tokens per calibration / fine-tuning sequence.")] = 256,
    finetune_steps: Annotated[int, typer.Option(
        min=0, max=10_000_000, help="Straight-through (STE) fine-tuning steps, a supervised run; 0: none.")] = 0,
    finetune_data: Annotated[Optional[str], typer.Option(help="Fine-tuning data (default: --data).")] = None,
    lr: Annotated[float, typer.Option(min=1e-12, max=10.0, help="Peak learning rate of the STE run.")] = 1e-3,
    batch_size: Annotated[Optional[int], typer.Option(min=1, max=65536, help="Micro batch size of the STE run (default: the largest up to 8 the planner fits).")] = None,
    lambda_warmup: Annotated[int, typer.Option(min=0, max=10_000_000, help="STE steps over which quantisation ramps in (0: none).")] = 0,
    max_drop: Annotated[Optional[float], typer.Option(
        min=0.0, max=1.0, help="Revert a layer when the relative eval drop exceeds this (default 0.10, the plan's bar).")] = None,
    metric: Annotated[str, typer.Option(help="Drop measured on: accuracy or perplexity.")] = "accuracy",
    revert: Annotated[bool, typer.Option("--revert/--no-revert", help="Layer-wise revert.")] = True,
    runs_dir: Annotated[Path, typer.Option(help="Where the STE run's folder goes.")] = Path("runs"),
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Write into OUT even if it holds other files (same names replaced, others kept).")] = False,
) -> None:
    """Compress to BitNet b1.58: absmean ternary linear weights packed 2 bits each; with --data, calibrate,
    fine-tune with the STE (--finetune-steps), revert costly layers and report."""
    from aegis.errors import AegisError, InvalidConfigError

    try:
        if not (src / "config.json").is_file():
            raise InvalidConfigError(f"{src} is not a model folder: pass a folder with config.json and *.safetensors")
        if scale_dtype not in ("float32", "bfloat16"):
            raise InvalidConfigError(f"--scale-dtype must be float32 or bfloat16, got {scale_dtype!r}")
        if data is None:
            if finetune_steps or finetune_data or max_drop is not None or samples is not None:
                raise InvalidConfigError("--finetune-steps, --finetune-data, --max-drop and --samples need --data "
                                         "(the calibration set)")
            from aegis.forge.bitnet import compress_model

            r = compress_model(src, out, per_channel=per_channel, scale_dtype=scale_dtype,  # type: ignore[arg-type]
                               keep_layers=tuple(keep_layer or ()), overwrite=overwrite)
        else:
            if keep_layer:
                raise InvalidConfigError("--keep-layer and --data: with calibration the layer-wise revert picks the "
                                         "kept layers; drop --keep-layer (or --data)")
            if metric not in ("accuracy", "perplexity"):
                raise InvalidConfigError(f"--metric must be accuracy or perplexity, got {metric!r}")
            from aegis.forge.bitnet_pipeline import FinetuneSettings, compress_calibrated

            ft = None
            if finetune_steps > 0:
                ft = FinetuneSettings(data=finetune_data, steps=finetune_steps, lr=lr, micro_batch_size=batch_size,
                                      seq_len=seq_len, lambda_warmup_steps=lambda_warmup)
            report = compress_calibrated(
                src, out, data=data, samples=samples, seq_len=seq_len, finetune=ft, runs_dir=runs_dir,
                max_drop=max_drop, metric=metric, revert=revert, per_channel=per_channel,  # type: ignore[arg-type]
                scale_dtype=scale_dtype,  # type: ignore[arg-type]
                on_stage=lambda s: typer.echo(s, err=True), overwrite=overwrite,
            )
            typer.echo(report.summary())
            r = report.compression
    except AegisError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except ImportError as err:
        from aegis._extras import missing_extra

        typer.echo(f"error: {missing_extra(err, '`aegis compress`')}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"compressed {r.total_params:,} params ({r.size_category}): {r.ternary_params:,} ternary "
        f"({r.sparsity:.1%} zeros), linear weights {r.linear_compression:.1f}x, whole model "
        f"{r.total_compression:.2f}x (target {r.target_compression:g}x) -> {r.out}"
    )


def evomerge(
    config: Annotated[Path, typer.Argument(
        metavar="CONFIG.yml", help="base_model, models (2+ fine-tunes), eval_data, generations, population, seed.")],
    out: Annotated[Path, typer.Argument(
        metavar="OUT", help="Run folder: best/ (the model), report.json/.txt, evolution.png, state/ (resume).")],
    resume: Annotated[Optional[bool], typer.Option(
        "--resume/--no-resume", help="Continue the run in OUT (default: resume when OUT/state exists).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the summary.")] = False,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Start a run in OUT even if it holds other files (they are kept).")] = False,
) -> None:
    """Evolve merges of fine-tunes of one base (linear/slerp x dare/ties x frankenmerge/dfs) into one model."""
    from aegis.errors import AegisError

    try:
        from aegis.forge.evomerge import evomerge as run_evomerge

        log = (lambda s: None) if quiet else (lambda s: typer.echo(s, err=True))
        r = run_evomerge(config, out, resume=resume, log=log, overwrite=overwrite)
    except AegisError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except ImportError as err:
        from aegis._extras import missing_extra

        typer.echo(f"error: {missing_extra(err, '`aegis evomerge`')}", err=True)
        raise typer.Exit(2) from None
    resumed = f", resumed after generation {r.resumed_from}" if r.resumed_from is not None else ""
    typer.echo(
        f"best {r.best_combo} ({r.best_combo_name}): fitness {r.best_fitness:.4f} vs best parent "
        f"{r.best_parent_fitness:.4f} ({r.improvement:+.1%}), {r.generations_run} generations{resumed} -> {r.best_model}"
    )


def _fail(err: Exception, what: str) -> None:
    from aegis.errors import AegisError

    if isinstance(err, AegisError):
        typer.echo(f"error: {err}", err=True)
    else:
        from aegis._extras import missing_extra

        typer.echo(f"error: {missing_extra(err, what)}", err=True)  # type: ignore[arg-type]
    raise typer.Exit(2) from None


def quietstar(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="HF model folder the engine serves (e.g. phase 2's).")],
    data: Annotated[str, typer.Argument(metavar="DATA", help="Reasoning JSONL {prompt, reasoning, answer}, or 'parity' (bundled task).")],
    out: Annotated[Path, typer.Argument(metavar="OUT", help="Folder: model/, report.json, report.md, state/ (resume).")],
    bake_steps: Annotated[int, typer.Option(min=0, max=10_000_000, help="Prompt-baking steps.")] = 200,
    rl_steps: Annotated[int, typer.Option(min=0, max=10_000_000, help="Quiet-STaR steps.")] = 50,
    bake_lr: Annotated[Optional[float], typer.Option(min=1e-12, max=10.0, help="Baking LR (default: preset 'bake').")] = None,
    rl_lr: Annotated[Optional[float], typer.Option(min=1e-12, max=10.0, help="Quiet-STaR LR (default: preset 'rl').")] = None,
    num_thoughts: Annotated[int, typer.Option(min=2, max=64, help="Thoughts per position.")] = 4,
    batch_size: Annotated[Optional[int], typer.Option(min=1, max=4096, help="Sequences per step (default: the planner's).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Write into OUT even if it holds other files.")] = False,
) -> None:
    """Phase 3: add thinking tokens, bake reasoning, train Quiet-STaR thoughts; report the ablation."""
    try:
        from aegis.forge.quietstar import QuietStarSettings, parity_rows, run_quietstar

        rows = parity_rows(256) if data == "parity" else data
        s = QuietStarSettings(bake_steps=bake_steps, rl_steps=rl_steps, bake_lr=bake_lr, rl_lr=rl_lr,
                              num_thoughts=num_thoughts, batch_size=batch_size)
        r = run_quietstar(model, rows, out, s, log=lambda m: typer.echo(m, err=True), overwrite=overwrite)
    except (ImportError, Exception) as err:  # noqa: BLE001 - AegisError / missing extra: one line
        from aegis.errors import AegisError

        if not isinstance(err, (AegisError, ImportError)):
            raise
        _fail(err, "`aegis quietstar`")
    a, fg = r["ablation"], r["ablation"]["free_generation"]
    if "format_free" in a:
        ff = a["format_free"]
        typer.echo(f"quiet-star: held-out format-free accuracy with thoughts {ff['with_thoughts']:.3f}, without "
                   f"{ff['without_thoughts']:.3f} ({ff['gain']:+.3f}; chance {a['chance']:.3f})")
    typer.echo(f"quiet-star: held-out free-generation accuracy with thoughts {fg['with_thoughts']:.3f}, without "
               f"{fg['without_thoughts']:.3f} ({fg['gain']:+.3f}); model from step {a['selected_step']} "
               f"-> {out / 'model'}")


def reasoning(
    prompts: Annotated[str, typer.Argument(metavar="PROMPTS", help="Prompts: a .txt (one per line), or a .jsonl / .csv / .parquet / dataset with a 'prompt' (or 'question') field.")],
    out: Annotated[Path, typer.Argument(metavar="OUT.jsonl", help="Reasoning rows {prompt, reasoning, answer} for `aegis quietstar`.")],
    endpoint: Annotated[str, typer.Option(help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")] = "http://127.0.0.1:8000/v1",
    model: Annotated[str, typer.Option(help="The model name the endpoint serves.")] = "default",
    api_key_env: Annotated[str, typer.Option(help="Environment variable holding the API key (unset: no key).")] = "OPENAI_API_KEY",
    cost_limit: Annotated[float, typer.Option(min=0.0, max=1e6, help="Stop before spending more than this, in USD.")] = 5.0,
    usd_per_1k_tokens: Annotated[float, typer.Option(min=0.0, max=1e3, help="Price of 1,000 tokens, in and out, in USD.")] = 0.002,
    rpm: Annotated[float, typer.Option(min=0.01, max=1e6, help="Requests per minute at most.")] = 50.0,
    retries: Annotated[int, typer.Option(min=0, max=100, help="Tries again on a reply whose markers fail validation.")] = 3,
    strategy: Annotated[str, typer.Option(help="Strategy token the reasoning opens with (<step>, <mece>, <falsify>, ...).")] = "<step>",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT.jsonl if it exists.")] = False,
) -> None:
    """Generate reasoning rows for Quiet-STaR's prompt baking through an OpenAI-compatible endpoint, under a cost limit
    and a rate limit, each reply's thinking markers validated (retried, then dropped)."""
    import os

    try:
        from aegis._outdir import check_output_file
        from aegis.errors import InvalidConfigError
        from aegis.forge.quietstar.reasoning_data import (
            STRATEGIES, GenerationLimits, endpoint_model, generate_reasoning, read_prompts, write_reasoning,
        )

        if strategy not in STRATEGIES:
            raise InvalidConfigError(f"--strategy {strategy!r} is not a strategy token; use one of {', '.join(STRATEGIES)}")
        check_output_file(out, overwrite=overwrite)  # before any request is paid for
        texts = read_prompts(prompts)
        llm = endpoint_model(endpoint, model, os.environ.get(api_key_env))
        limits = GenerationLimits(cost_limit_usd=cost_limit, usd_per_1k_tokens=usd_per_1k_tokens, retries=retries,
                                  requests_per_minute=rpm)
        rows, stats = generate_reasoning(llm, texts, strategy=strategy, limits=limits)
        if not rows:
            why = f" (last error: {stats['last_error']})" if "last_error" in stats else ""
            raise InvalidConfigError(f"no valid reasoning row from {endpoint} for {len(texts)} prompts{why}; "
                                     "check --endpoint and --model")
        path = write_reasoning(rows, out, overwrite=overwrite)
    except (ImportError, Exception) as err:  # noqa: BLE001 - AegisError / missing extra: one line
        from aegis.errors import AegisError

        if not isinstance(err, (AegisError, ImportError)):
            raise
        _fail(err, "`aegis reasoning`")
    stop = f"; stopped at the ${cost_limit:,.2f} cost limit" if stats["stopped_at_cost_limit"] else ""
    typer.echo(f"reasoning: {len(rows)} of {len(texts)} prompts -> {path} ({stats['requests']} requests, "
               f"{stats['tokens']:,} tokens, ${stats['cost_usd']:,.3f}; {stats['rejected']} rejected{stop})")


def forge(
    config: Annotated[Optional[Path], typer.Argument(metavar="CONFIG.yml", help="Forge YAML (phase1..phase4); omit with --tiny.")] = None,
    out: Annotated[Optional[Path], typer.Argument(metavar="OUT", help="Folder for phase1_cognate/ .. phase4_bitnet/ and final/.")] = None,
    tiny: Annotated[bool, typer.Option("--tiny", help="Toy scale on a CPU with bundled data (aegis forge --tiny OUT).")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start in OUT even if it holds other files (they are kept).")] = False,
) -> None:
    """Chain phases 1 -> 4 (Cognate, EvoMerge, Quiet-STaR, BitNet); re-running resumes."""
    from aegis.errors import InvalidConfigError

    try:
        from aegis.forge.pipeline import load_forge_config, run_forge, tiny_config

        if tiny and out is None and config is not None:
            config, out = None, config
        if out is None or (config is None and not tiny):
            raise InvalidConfigError("usage: aegis forge CONFIG.yml OUT, or aegis forge --tiny OUT")
        cfg = tiny_config() if tiny and config is None else load_forge_config(config)  # type: ignore[arg-type]
        if tiny:
            cfg["tiny"] = True
        run_forge(cfg, out, log=lambda m: typer.echo(m, err=True), overwrite=overwrite)
    except (ImportError, Exception) as err:  # noqa: BLE001
        from aegis.errors import AegisError

        if not isinstance(err, (AegisError, ImportError)):
            raise
        _fail(err, "`aegis forge`")
    typer.echo(f"forge: 4 phases done -> {out / 'final'}")


def generate(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="HF folder, export, Cognate, Quiet-STaR or compressed model.")],
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The user message (rendered with the chat template).")],
    max_new_tokens: Annotated[int, typer.Option(min=1, max=100_000, help="Most tokens to sample.")] = 64,
    temperature: Annotated[float, typer.Option(min=0.0, max=100.0, help="0: greedy.")] = 0.7,
    seed: Annotated[int, typer.Option(min=0, max=2**31 - 1, help="Sampling seed.")] = 0,
    show_thoughts: Annotated[bool, typer.Option("--show-thoughts", help="Print a Quiet-STaR model's thoughts in [ ].")] = False,
) -> None:
    """Sample from a model, streaming tokens to stdout."""
    try:
        from aegis.forge.generate import generate as run_generate

        r = run_generate(model, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                         show_thoughts=show_thoughts, on_text=lambda s: typer.echo(s, nl=False))
    except (ImportError, Exception) as err:  # noqa: BLE001
        from aegis.errors import AegisError

        if not isinstance(err, (AegisError, ImportError)):
            raise
        _fail(err, "`aegis generate`")
    typer.echo("")
    extra = f", halting steps {r['halting_steps']}" if r.get("halting_steps") else ""
    typer.echo(f"({len(r['tokens'])} tokens, {r['kind']}{extra})", err=True)


def cognate(
    config: Annotated[Optional[Path], typer.Argument(metavar="CONFIG.yml", help="Phase-1 YAML (variants, data, curriculum, train); omit with --tiny.")] = None,
    out: Annotated[Optional[Path], typer.Argument(metavar="OUT", help="Folder: one HF folder per variant, report.json, report.md.")] = None,
    tiny: Annotated[bool, typer.Option("--tiny", help="CPU-sized models, a few dozen steps, bundled data.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Write into OUT even if it holds other files.")] = False,
) -> None:
    """Phase 1: train three Cognate models (TRM x Titans-MAG), check their diversity, export each; re-running resumes."""
    from aegis.errors import InvalidConfigError

    try:
        from aegis.forge.cognate.phase1 import load_phase1_config, run_phase1

        if tiny and out is None and config is not None:
            config, out = None, config
        if out is None or (config is None and not tiny):
            raise InvalidConfigError("usage: aegis cognate CONFIG.yml OUT, or aegis cognate --tiny OUT")
        cfg = load_phase1_config(config, tiny=tiny)
        folders = run_phase1(cfg, out, tiny=tiny, overwrite=overwrite, log=lambda m: typer.echo(m, err=True))
    except (ImportError, Exception) as err:  # noqa: BLE001
        from aegis.errors import AegisError

        if not isinstance(err, (AegisError, ImportError)):
            raise
        _fail(err, "`aegis cognate`")
    typer.echo(f"cognate: {len(folders)} models -> {', '.join(str(f) for f in folders)}")
