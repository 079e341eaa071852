"""``aegis merge CONFIG.yml OUT``: merge models from a mergekit YAML into a Hugging Face folder.

Mount the command function on a typer app: ``app.command("merge")(merge)``. Errors Aegis raises
on purpose print one line and exit 2, whether mounted on the main app or driven alone (tests use
typer's ``CliRunner``). Imports nothing heavy until the command runs.

    aegis merge merge.yml ./merged
    aegis merge merge.yml ./merged --seed 0 --max-shard-size 2GB --overwrite
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer

__all__ = ["merge", "compress", "parse_size"]

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
    seed: Annotated[Optional[int], typer.Option(help="Seed of DARE's random drop masks (reproducible merges).")] = None,
    max_shard_size: Annotated[str, typer.Option(help="Largest safetensors shard, e.g. 5GB, 2GiB, 500MB.")] = "5GiB",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Write into OUT even if it holds files.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Merge models as mergekit does: linear, slerp, task_arithmetic, ties, dare_ties, dare_linear, passthrough."""
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
        "--keep-layer", help="Decoder layer kept in full precision (repeatable).")] = None,
) -> None:
    """Compress to BitNet b1.58: absmean ternary linear weights packed 2 bits each (no fine-tuning yet)."""
    from aegis.errors import AegisError, InvalidConfigError

    try:
        if not (src / "config.json").is_file():
            raise InvalidConfigError(f"{src} is not a model folder: pass a folder with config.json and *.safetensors")
        if scale_dtype not in ("float32", "bfloat16"):
            raise InvalidConfigError(f"--scale-dtype must be float32 or bfloat16, got {scale_dtype!r}")
        from aegis.forge.bitnet import compress_model

        r = compress_model(src, out, per_channel=per_channel, scale_dtype=scale_dtype,  # type: ignore[arg-type]
                           keep_layers=tuple(keep_layer or ()))
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
