"""The `aegis` command line: plan, compare, models, gpus, benchmark, and the run commands.

    aegis plan "qlora llama-3.1-8b on 3090 with ./data/support.jsonl"
    aegis plan --model llama-3.1-8b --method qlora --gpu 3090 --json
    aegis compare "lora qwen2.5-7b, seq 2048"

Start-up stays light: no JAX, torch, transformers or gradio unless a command needs them. Every
`AegisError`, usage error, pydantic ValidationError or refused path is printed as one line (exit 2); any other
exception as one line naming its type and a log file holding the traceback (exit 1): ``$AEGIS_LOG_DIR``, else
``$XDG_STATE_HOME/aegis/logs`` (``~/.local/state/aegis/logs``), else the temporary folder. Ctrl-C exits 130.
"""

from __future__ import annotations

import gc
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from aegis.errors import AegisError

__all__ = ["app", "main"]

app = typer.Typer(
    name="aegis",
    help="Plan a fine-tune before renting a GPU; train it under a self-healing supervisor.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Output(str, Enum):
    text = "text"
    markdown = "markdown"
    json = "json"


def _output(json_: bool, markdown: bool) -> Output:
    if json_ and markdown:
        raise typer.BadParameter("pick one of --json and --markdown")
    return Output.json if json_ else Output.markdown if markdown else Output.text


def _max(setting: str) -> float:
    """The largest value a flag takes: the same sanity range as the free text's (`aegis.planning._parse_vocab._BOUNDS`)."""
    from aegis.planning._parse_vocab import _BOUNDS

    return _BOUNDS[setting][1]


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
MarkdownOpt = Annotated[bool, typer.Option("--markdown", help="Print Markdown (chat, Slack).")]


@app.command()
def plan(
    request: Annotated[Optional[str], typer.Argument(help="Free text, e.g. 'qlora llama-3.1-8b on 3090 with ./data.jsonl'.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model alias, Hub id or config.json path.")] = None,
    method: Annotated[Optional[str], typer.Option(help="full, lora or qlora.")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPU name, e.g. 3090, a100-80gb.")] = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", min=1, max=_max("gpu_count"), help="Number of GPUs.")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="JSONL/JSON/CSV/Parquet path or Hub dataset id.")] = None,
    rank: Annotated[Optional[int], typer.Option(min=1, max=_max("lora_rank"), help="LoRA rank.")] = None,
    targets: Annotated[Optional[str], typer.Option(
        help="LoRA target modules, comma-separated PEFT names (q_proj,v_proj; w1,w2,w3 on Mixtral) or all-linear.")] = None,
    batch: Annotated[Optional[int], typer.Option(
        min=1, max=_max("micro_batch_size"), help="Micro batch size (default: solved).")] = None,
    effective_batch: Annotated[Optional[int], typer.Option(
        min=1, max=_max("effective_batch_size"), help="Target effective batch (default 16).")] = None,
    seq: Annotated[Optional[int], typer.Option(min=1, max=_max("seq_len"), help="Sequence length (default: dataset p95).")] = None,
    epochs: Annotated[Optional[float], typer.Option(min=0.01, max=_max("epochs"), help="Epochs (default 3).")] = None,
    optimizer: Annotated[Optional[str], typer.Option(help="adamw, adamw_8bit, paged_adamw_8bit, sgd, adafactor.")] = None,
    checkpointing: Annotated[Optional[bool], typer.Option("--checkpointing/--no-checkpointing", help="Force gradient checkpointing.")] = None,
    trainer: Annotated[Optional[str], typer.Option(
        help="What runs the step: hf, trl, peft (plain loop, no k-bit prep), axolotl, unsloth (default: detected).")] = None,
    transformers: Annotated[Optional[str], typer.Option(
        "--transformers", help="transformers version the run uses, e.g. 4.48 or 5 (default: the installed one).")] = None,
    kbit_prep: Annotated[Optional[bool], typer.Option(
        "--kbit-prep/--no-kbit-prep", help="prepare_model_for_kbit_training runs (default: the trainer's).")] = None,
    liger: Annotated[Optional[bool], typer.Option("--liger/--no-liger", help="Liger kernels on (default off).")] = None,
    checkpoint_mode: Annotated[Optional[str], typer.Option(
        help="Checkpointing variant: non_reentrant, reentrant, offload (Unsloth's; its default).")] = None,
    lora_dropout: Annotated[Optional[float], typer.Option(min=0.0, max=0.99, help="LoRA dropout (default 0).")] = None,
    autocast: Annotated[Optional[bool], typer.Option(
        "--autocast/--no-autocast",
        help="The step runs under torch.autocast (default: the trainer's; HF Trainer's bf16=True does).")] = None,
    sharding: Annotated[Optional[str], typer.Option(
        help="Over several GPUs: ddp (replicate) or fsdp (FULL_SHARD) (default: the faster one that fits).")] = None,
    zero_stage: Annotated[Optional[int], typer.Option(
        "--zero-stage", help="DeepSpeed ZeRO stage over several GPUs: 2 or 3 (default: none).")] = None,
    emit: Annotated[Optional[str], typer.Option(help="Also write a trainer config: axolotl, hf or unsloth.")] = None,
    out: Annotated[Optional[str], typer.Option(help="Where --emit writes (default: stdout).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Let --out replace an existing file.")] = False,
    json_: JsonOpt = False,
    markdown: MarkdownOpt = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show every formula and reason (text and Markdown).")] = False,
) -> None:
    """Plan a fine-tune: memory breakdown, recommended / aggressive / fallback configs, time, cost, risks."""
    from aegis.planning.planner import plan as make_plan

    fmt = _output(json_, markdown)
    if out:  # before planning: a file that exists or cannot be written is one line, and nothing is printed
        from aegis._outdir import check_output_file

        if not emit:
            raise typer.BadParameter("--out is where --emit writes its config; add --emit axolotl, hf or unsloth")
        check_output_file(out, overwrite=overwrite)
    report = make_plan(
        request, model=model, method=method, gpu=gpu, gpu_count=gpus, dataset=dataset, lora_rank=rank,
        lora_targets=_targets(targets),
        micro_batch_size=batch, effective_batch_size=effective_batch, seq_len=seq, epochs=epochs, optimizer=optimizer,
        gradient_checkpointing=checkpointing, progress=fmt is Output.text and sys.stderr.isatty(),
        trainer=trainer, transformers_version=transformers, kbit_prep=kbit_prep, liger=liger,
        checkpointing_mode=checkpoint_mode, lora_dropout=lora_dropout, autocast=autocast, sharding=sharding,
        zero_stage=zero_stage,
    )
    _print_report(report, fmt, explain=explain)
    if emit:
        from aegis.planning.report.emit import emit as emit_config

        text = emit_config(report, emit)  # type: ignore[arg-type]
        if out:
            from aegis._outdir import write_output_file

            write_output_file(out, text, overwrite=overwrite)
            typer.echo(f"wrote {emit} config to {out}", err=True)
        else:
            typer.echo(text)


def _print_report(report, fmt: Output, *, explain: bool = False) -> None:
    if fmt is Output.json:
        from aegis.planning.report.json import render_json

        typer.echo(render_json(report))
    elif fmt is Output.markdown:
        from aegis.planning.report.markdown import render_markdown

        typer.echo(render_markdown(report, explain=explain))
    else:
        from aegis.planning.report.text import render_text

        typer.echo(render_text(report, explain=explain))


@app.command()
def compare(
    request: Annotated[Optional[str], typer.Argument(help="The job, e.g. 'lora qwen2.5-7b seq 2048' (no GPU needed).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model alias, Hub id or config.json path.")] = None,
    method: Annotated[Optional[str], typer.Option(help="full, lora or qlora.")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="Dataset path or Hub id (for time and cost).")] = None,
    seq: Annotated[Optional[int], typer.Option(min=1, max=_max("seq_len"), help="Sequence length.")] = None,
    json_: JsonOpt = False,
    markdown: MarkdownOpt = False,
) -> None:
    """Which catalog GPUs fit this job, cheapest first."""
    from aegis.planning.compare import compare_gpus, render_comparison

    rows = compare_gpus(request, model=model, method=method, dataset=dataset, seq_len=seq)
    typer.echo(render_comparison(rows, _output(json_, markdown).value))


@app.command()
def models(
    query: Annotated[Optional[str], typer.Argument(
        help="Words of an id or alias, e.g. 'qwen', 'coder', 'llama3.1:8b'.")] = None,
    family: Annotated[Optional[str], typer.Option(help="A family ('llama-3.1', 'qwen2.5') or series ('llama').")] = None,
    size: Annotated[Optional[str], typer.Option(help="A size as named: 8b, 0.5b, 8x7b, 30b (finds 30b-a3b).")] = None,
    architectures: Annotated[bool, typer.Option(
        "--architectures", help="List the architectures (config.json model_type) Aegis plans and trains instead.")] = False,
    json_: JsonOpt = False,
    markdown: MarkdownOpt = False,
) -> None:
    """The bundled models (offline): family, size, total/active parameters from shapes, context, config source."""
    import json

    if architectures:
        _architectures(query, _output(json_, markdown))
        return

    from aegis.models import catalog
    from aegis.planning.compare import _table
    from aegis.models.profiles import profile_from_config

    fmt = _output(json_, markdown)
    found = catalog.search(query, family=family, size=size)
    if not found:
        asked = " ".join(f"{k} {v!r}" for k, v in (("query", query), ("family", family), ("size", size)) if v)
        typer.secho(f"no bundled model matches {asked}: `aegis models` lists them all; for any other model pass "
                    "its Hub id or the path of its config.json", err=True)
        raise typer.Exit(1)
    rows = []
    for entry in found:
        p = profile_from_config(catalog.read_model_config(entry), model_id=entry.id, source="catalog")
        rows.append({"id": entry.id, "also_ids": list(entry.also_ids), "family": entry.family,
                     "size": entry.size, "variant": entry.variant, "architecture": p.architecture, "params": p.total_params,
                     "active_params": p.active_params_per_token, "context": p.max_position_embeddings,
                     "source": str(entry.source), "aliases": list(entry.aliases)})
    if fmt is Output.json:
        typer.echo(json.dumps(rows, indent=2))
        return

    def count(n: int) -> str:
        return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"

    def source(entry: catalog.CatalogModel) -> str:
        src = entry.source
        if src.library == "github":  # repo@commit (the file's path, the full commit and #entry are in --json)
            repo, _, where = src.entry.partition(":")
            entry_key = where.partition("#")[2]
            text = f"{repo}@{src.version[:7]}" + (f" #{entry_key}" if entry_key else "")
        else:
            text = "Hub config.json" if src.library == "hub" else f"{src.library} {src.version} {src.entry}"
        return text + (f" (+{len(src.overrides)} set)" if src.overrides else "")

    body = [[r["id"] + (f" (+{len(r['also_ids'])})" if r["also_ids"] else ""), r["family"], r["size"],
             count(r["params"]), count(r["active_params"]) if r["active_params"] != r["params"] else "",
             f"{r['context'] // 1024}k" if r["context"] % 1024 == 0 else f"{r['context']:,}", source(entry)]
            for r, entry in zip(rows, found)]
    title = f"Bundled models (offline): {len(rows)} of {len(catalog.models())}"
    typer.echo(_table(["model (+ids sharing its config)", "family", "size", "params", "active", "context",
                       "config from"], body, fmt.value, title))


def _architectures(query: str | None, fmt: Output) -> None:
    """The architecture registry as a table: any config.json of these model types can be planned and trained."""
    import json

    from aegis.models.architectures import registry
    from aegis.planning.compare import _table

    rows = [{"model_type": e.model_type, "also": list(e.also_model_types), "architectures": list(e.hf_architectures),
             "description": e.description, "transformers_since": e.transformers_since}
            for e in registry.all_entries()
            if not query or query.lower() in " ".join([e.model_type, *e.also_model_types, *e.hf_architectures,
                                                       e.description]).lower()]
    if not rows:
        typer.secho(f"no architecture matches {query!r}: `aegis models --architectures` lists them all", err=True)
        raise typer.Exit(1)
    if fmt is Output.json:
        typer.echo(json.dumps(rows, indent=2))
        return
    body = [[r["model_type"] + (f" ({', '.join(r['also'])})" if r["also"] else ""), ", ".join(r["architectures"]),
             r["description"], r["transformers_since"]] for r in rows]
    title = f"Architectures (pass any config.json of these): {len(rows)} of {len(registry.all_entries())}"
    typer.echo(_table(["model_type", "class", "kind", "transformers since"], body, fmt.value, title))


@app.command()
def gpus(json_: JsonOpt = False, markdown: MarkdownOpt = False) -> None:
    """The GPU catalog: memory, bf16 TFLOPS, framework overhead, cheapest price."""
    from aegis.planning.compare import render_gpus

    typer.echo(render_gpus(_output(json_, markdown).value))


@app.command()
def benchmark(
    model: Annotated[str, typer.Argument(help="Model alias, Hub id, local model folder or config.json path.")],
    method: Annotated[str, typer.Option(help="full, lora or qlora.")] = "lora",
    batch: Annotated[int, typer.Option(min=1, max=_max("micro_batch_size"), help="Micro batch size.")] = 1,
    seq: Annotated[int, typer.Option(min=2, max=_max("seq_len"), help="Sequence length.")] = 512,
    steps: Annotated[int, typer.Option(min=1, max=100_000, help="Measured steps after warm-up.")] = 10,
    gpu: Annotated[Optional[str], typer.Option(help="Catalog GPU id to file the result under (default: detected).")] = None,
    precision: Annotated[str, typer.Option(help="fp32, bf16, bf16_mixed or fp16_mixed.")] = "bf16",
    remat: Annotated[bool, typer.Option(help="Gradient checkpointing (recompute each layer's forward).")] = False,
    remat_layers: Annotated[Optional[int], typer.Option(
        min=0, max=100_000, help="With --remat, lora/qlora: recompute only the first N layers; the rest keep "
        "their activations.")] = None,
    packing: Annotated[bool, typer.Option(help="Pack several examples per row (--no-packing: one per row).")] = True,
    buckets: Annotated[bool, typer.Option(help="With --no-packing: length-bucketed batches, padded to a few lengths.")] = False,
    json_: JsonOpt = False,
) -> None:
    """Run real training steps on this machine and store tokens/s and peak memory for `aegis plan`; report the
    compiled step's FLOPs against the model's, how full the packed batches are and the host time the device waited on."""
    if method not in ("full", "lora", "qlora"):  # checked before JAX is imported
        raise typer.BadParameter(f"--method {method!r}: use full, lora or qlora")
    if precision not in ("fp32", "bf16", "bf16_mixed", "fp16_mixed"):
        raise typer.BadParameter(f"--precision {precision!r}: use fp32, bf16, bf16_mixed or fp16_mixed")
    from aegis.models.resolve import resolve_model

    resolve_model(model)  # an unknown model is one line before JAX is imported
    if gpu is not None:  # a catalog id, checked before minutes of training steps (not filed under a typo)
        from aegis.planning.hardware import find_gpu

        gpu = find_gpu(gpu).id
    from aegis.train.benchmark import run_benchmark

    result = run_benchmark(model, method=method, micro_batch_size=batch, seq_len=seq, steps=steps, gpu_id=gpu,
                           precision=precision, gradient_checkpointing=remat or remat_layers is not None,
                           remat_layers=remat_layers, packing=packing, buckets=buckets)
    typer.echo(result.model_dump_json(indent=2) if json_ else _benchmark_text(result))


def _targets(text: str | None) -> tuple[str, ...] | None:
    """``--targets 'q_proj, v_proj'`` -> ("q_proj", "v_proj")."""
    if text is None:
        return None
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise typer.BadParameter("name at least one module, e.g. --targets q_proj,v_proj or --targets all-linear")
    return names


def _benchmark_text(result) -> str:
    rec = getattr(result, "record", result)
    share = "" if rec.mfu is None else f"{rec.mfu:.0%}" if rec.mfu >= 0.01 else f"{rec.mfu * 100:.2g}%"
    mfu = f", MFU {share} of the catalog bf16 peak" if share else ""
    line = (f"{rec.model_id} {rec.method} on {rec.device}: {rec.tokens_per_s:,.0f} tokens/s{mfu}, "
            f"peak {rec.peak_memory_bytes / 1e9:.2f} GB -- stored for GPU '{rec.gpu_id}'")
    ratio = getattr(result, "flops_ratio", None)
    if ratio is None:
        return line
    layout = ("packed" if result.packing else f"bucketed ({len(result.batch_lengths)} lengths)" if result.buckets
              else "padded")
    return (f"{line}\ncompiled step {result.compiled_flops_per_token / 1e6:,.2f} MFLOP/token = {ratio:.2f}x the "
            f"model's {result.model_flops_per_token / 1e6:,.2f}; {layout} batches {result.useful_token_fraction:.0%} "
            f"tokens ({result.loss_token_fraction:.0%} trained on); host wait {result.host_wait_s * 1e3:.1f} ms/step")


def _mount_missing(names: tuple[str, ...], err: ImportError) -> None:
    """Commands whose extra is not installed: listed by --help, and each says in one line what to install."""
    from rich.markup import escape

    from aegis._extras import COMMAND_EXTRAS, install_hint
    from aegis.errors import MissingExtraError

    for name in names:
        extra = COMMAND_EXTRAS.get(name, "apps")  # a plug-in command (aegis.commands) not in the table: a front end

        def stub(ctx: typer.Context, _name: str = name, _extra: str = extra) -> None:
            raise MissingExtraError(
                f"`aegis {_name}` needs the '{_extra}' extra ({err}): {install_hint(_extra)}"
            )

        app.command(
            name,
            help=escape(f"(not installed: {install_hint(extra)})"),
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        )(stub)


COMMANDS_GROUP = "aegis.commands"
"""Entry-point group of the commands front ends plug into `aegis` (``chat``/``slack`` from ``aegis_apps.launchers``,
declared in pyproject.toml): the SDK names no app, it mounts what the installed distributions declare."""


def _mount_run_commands() -> None:
    """The supervisor's commands (run, resume, status, interrupt, command, export) live in aegis.cli.supervised;
    the front ends' (`chat`, `slack`) are the ``aegis.commands`` entry points. Without their extra, stand-ins name
    the extra to install."""
    try:
        import aegis.supervise  # noqa: F401  the supervisor itself (langgraph, the engine): the 'supervise' extra
        from aegis.cli.supervised import register
    except ImportError as err:  # the supervisor's CLI module is optional in a planner-only install
        _mount_missing(("run", "resume", "status", "interrupt", "command", "export", "chat", "slack"), err)
        return
    register(app)
    from importlib.metadata import entry_points

    from aegis._extras import COMMAND_EXTRAS

    mounted = set()
    for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        if ep.name in mounted or ep.name in {c.name for c in app.registered_commands}:
            continue  # two distributions declaring one name: the first wins, never a command mounted twice
        try:
            command = ep.load()
        except ImportError as err:  # the front end's package or its extra is not installed
            _mount_missing((ep.name,), err)
        else:
            app.command(ep.name)(command)
        mounted.add(ep.name)
    apps = tuple(n for n, extra in COMMAND_EXTRAS.items() if extra == "apps" and n not in mounted)
    if apps:  # no installed distribution declares them: the apps are not installed
        _mount_missing(apps, ModuleNotFoundError("no module named 'aegis_apps'", name="aegis_apps"))


_PLANNER_COMMANDS = frozenset({"plan", "compare", "models", "gpus", "benchmark"})


def _mount_forge_commands() -> None:
    """`aegis merge` (mergekit YAML); mounted only when asked for or listed, so `aegis plan` stays light."""
    from aegis.cli.forge import cognate, compress, evomerge, forge, generate, merge, quietstar, reasoning

    app.command("merge")(merge)
    app.command("evomerge")(evomerge)
    app.command("compress")(compress)
    app.command("quietstar")(quietstar)
    app.command("reasoning")(reasoning)
    app.command("forge")(forge)
    app.command("generate")(generate)
    app.command("cognate")(cognate)


LOG_DIR_ENV = "AEGIS_LOG_DIR"
"""Where `aegis` writes the traceback of an error it did not expect (default: ``$XDG_STATE_HOME/aegis/logs``, else
``~/.local/state/aegis/logs``; the system's temporary folder when that cannot be written)."""


def crash_log_dir() -> Path:
    """The folder of crash logs: $AEGIS_LOG_DIR, else the XDG state folder's ``aegis/logs``."""
    if os.environ.get(LOG_DIR_ENV):
        return Path(os.environ[LOG_DIR_ENV]).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "aegis" / "logs"


def _write_crash_log(args: list[str]) -> Path | None:
    """The current exception's traceback, the command line and versions, in a new file; its path (None if no
    folder could be written)."""
    import platform
    import tempfile
    import time
    import traceback

    try:
        from importlib.metadata import version

        aegis_version = version("aegis-ml")
    except Exception:  # noqa: BLE001 - a crash log must not fail for metadata
        aegis_version = "unknown"
    text = (f"aegis {aegis_version}, Python {platform.python_version()}, {platform.platform()}\n"
            f"command: aegis {' '.join(args)}\n\n{traceback.format_exc()}")
    stem = time.strftime("crash-%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    for folder in (crash_log_dir(), Path(tempfile.gettempdir()) / "aegis-logs"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for n in range(100):  # never over another crash's log (several in one second of one process)
                path = folder / (f"{stem}.log" if n == 0 else f"{stem}-{n}.log")
                try:
                    with path.open("x", encoding="utf-8") as fh:
                        fh.write(text)
                    return path
                except FileExistsError:
                    continue
        except OSError:
            continue
    return None


def _one_line(text: object, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _usage_line(err: Exception, args: list[str]) -> str:
    """A usage error as one line naming the value given and where to look:
    "Invalid value for '--rank' ('1000000'): Input should be less than or equal to 4096 (`aegis plan --help` ...)"."""
    ctx = getattr(err, "ctx", None)
    where = ctx.command_path if ctx is not None else "aegis"
    message = err.format_message() if hasattr(err, "format_message") else str(err)
    opts = getattr(getattr(err, "param", None), "opts", None) or ()
    given = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in opts), None)
    given = given if given is not None else next((a.split("=", 1)[1] for a in args if a.split("=", 1)[0] in opts
                                                  and "=" in a), None)
    if given is not None and ":" in message:
        head, _, tail = message.partition(":")
        message = f"{head} ({given!r}):{tail}"
    return f"{_one_line(message)} (`{where} --help` lists the options)"


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one-line errors, exit code 2, never a traceback for AegisError.

    The last line of defence: bad input the commands did not catch (a pydantic ValidationError, a file that is not
    text, a path that is a folder) is one line, exit 2; any other exception one line naming its type and the log
    file holding its traceback (`crash_log_dir`), exit 1. Ctrl-C exits 130."""
    import click
    from pydantic import ValidationError

    args = sys.argv[1:] if argv is None else argv
    mounted = {c.name for c in app.registered_commands}  # main() may run again in one process (tests, the agent)
    if (not args or args[0] not in _PLANNER_COMMANDS) and "merge" not in mounted:
        _mount_forge_commands()
    if (not args or args[0] not in _PLANNER_COMMANDS | {"merge", "compress", "evomerge", "quietstar", "reasoning", "forge", "generate", "cognate"}) and "run" not in mounted:
        _mount_run_commands()  # keeps `aegis plan` from importing the supervisor
    try:
        rc = app(args=args, standalone_mode=False, prog_name="aegis")
        if isinstance(rc, int) and rc:  # typer.Exit(n) is returned, not raised, outside standalone mode
            raise SystemExit(rc)
    except AegisError as err:
        typer.secho(f"error: {_one_line(err, 2000)}", err=True, fg="red")
        raise SystemExit(2) from None
    except ImportError as err:  # an optional extra is not installed: name it, no traceback
        from aegis._extras import missing_extra

        command = next((a for a in args if not a.startswith("-")), "")
        typer.secho(f"error: {missing_extra(err, f'`aegis {command}`'.replace(' `', '`'))}", err=True, fg="red")
        raise SystemExit(2) from None
    except (typer.Abort, click.exceptions.Abort, KeyboardInterrupt):
        raise SystemExit(130) from None
    except (typer.Exit, click.exceptions.Exit) as err:
        raise SystemExit(err.exit_code) from None
    except (typer.TyperException, click.ClickException) as err:  # usage errors: bad option values, unknown options
        if type(err).__name__ == "NoArgsIsHelpError":  # `aegis plan` alone: its help
            err.show()
        else:
            typer.secho(f"error: {_usage_line(err, args)}", err=True, fg="red")
        raise SystemExit(getattr(err, "exit_code", 2)) from None
    except ValidationError as err:  # user input a loader validated without naming it
        from aegis._validation import validation_line

        typer.secho(f"error: {_one_line(validation_line(err), 2000)}", err=True, fg="red")
        raise SystemExit(2) from None
    except UnicodeDecodeError as err:
        typer.secho(f"error: a file read as text is not UTF-8 text (byte {err.object[err.start:err.start + 1]!r} at "
                    f"offset {err.start}): pass a YAML, JSON or JSONL text file", err=True, fg="red")
        raise SystemExit(2) from None
    except OSError as err:  # a path the user gave that the system refuses (missing, a folder, too long, no access)
        if not err.filename:
            path = _write_crash_log(args)
            where = f"details in {path}" if path is not None else "no log could be written"
            typer.secho(f"error: {type(err).__name__}: {_one_line(err)} ({where})", err=True, fg="red")
            raise SystemExit(1) from None
        name = _one_line(err.filename, 120)
        typer.secho(f"error: {err.strerror or type(err).__name__}: {name}: check the path", err=True, fg="red")
        raise SystemExit(2) from None
    except Exception as err:  # noqa: BLE001 - the last line of defence: one line and a log, never a traceback
        path = _write_crash_log(args)
        where = f"details in {path}" if path is not None else "no log could be written"
        typer.secho(f"error: {type(err).__name__}: {_one_line(err)} ({where})", err=True, fg="red")
        raise SystemExit(1) from None
    finally:
        if argv is None:  # the console script: the process exits next, and its last garbage collection
            gc.freeze()  # then skips every object alive now (~40 ms of a cold `aegis plan`; the OS frees them)


if __name__ == "__main__":
    main()
