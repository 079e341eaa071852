"""Benchmark the two loading paths a run starts with, side by side in one run, against the libraries' own.

1. Weights: Aegis' ``load_checkpoint`` (safetensors -> the JAX params tree, also with ``nf4=True``) vs
   safetensors' own numpy loaders (``load_file``; ``safe_open`` reading every tensor; the same plus
   ``jax.device_put`` so it too ends on the device), on a random llama checkpoint written once with
   transformers' ``save_pretrained`` (cached in a temp folder). GB/s of checkpoint bytes, the median of
   interleaved rounds read from a warm page cache, and the host peak RSS growth of one load.
2. Sharded loading (``--only sharded``, on ``--devices`` forced host devices, ``--mesh fsdp=4``): each parameter read
   whole, stacked over layers, then ``jax.device_put`` on its sharding (the loader before streaming) vs
   ``load_checkpoint(place=Placement(...))``, which reads each device's slice from the files alone. Seconds, the
   host peak RSS / anonymous growth of one load in a fresh process (the loaded arrays included: on CPU the devices
   are host memory), and the numpy memory the load held only while it ran (tracemalloc: a stacked parameter, or a
   shard and a read chunk).
3. Tokenisation of ShareGPT-style chats (2-6 turns, generated here): ``ChatRenderer.render`` on a template
   with ``{% generation %}`` tags and on one without (the prefix-rendering path), ``ChatRenderer.lengths``
   (batched), vs transformers' ``apply_chat_template`` with and without the assistant mask, on a byte-level
   BPE trained here with a ChatML template. Rows/s, the median over interleaved chunks of the rows.

    python -m tools.bench.bench_loading [--size small|medium] [--rows 10000] [--only weights|sharded|tokenize]
                                        [--dtype bf16|fp32] [--shards 2] [--repeat 3] [--devices 4 --mesh fsdp=4]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import random
import statistics
import string
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.hf_folders import CHATML, SPECIALS

SIZES: dict[str, dict[str, int]] = {
    # ~160M parameters (320 MB in bf16)
    "small": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
              "num_key_value_heads": 8, "vocab_size": 32000},
    # ~410M parameters (820 MB in bf16)
    "medium": {"hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 12, "num_attention_heads": 16,
               "num_key_value_heads": 8, "vocab_size": 32000},
}
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
BASELINE_WEIGHTS = "safe_open + jax.device_put"
BASELINE_SHARDED = "whole parameter, then device_put (before)"
BASELINE_TOKENIZE = "transformers apply_chat_template + mask"

# Renders the same text as CHATML (tools.hf_folders; the newline after each turn is an expression: a literal one right after
# ``{% endif %}`` would be eaten by transformers' trim_blocks), so both templates give the same token ids.
CHATML_GENERATION = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ----- host memory --------------------------------------------------------------------------------------


def _statm_bytes() -> tuple[int, int] | None:
    """(resident, resident anonymous) bytes of this process, from /proc/self/statm; None off Linux."""
    try:
        with open("/proc/self/statm") as f:
            fields = f.read().split()
    except OSError:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    resident, shared = int(fields[1]) * page, int(fields[2]) * page
    return resident, resident - shared


def _hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _trim_heap() -> None:
    """Hand freed heap memory back to the OS (glibc), so the next load's growth is not hidden by reuse."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_rss_growth(fn: Callable[[], Any]) -> tuple[float, float]:
    """(peak resident, peak anonymous resident) bytes above the level before ``fn()``, its result included.

    Resident counts the file pages a memory map touched (numpy memmap, safetensors' mmap); anonymous is
    memory the process allocated. The peak of both comes from a thread sampling every millisecond, the
    resident peak also from the kernel's exact VmHWM mark where it can be reset. NaN where neither
    /proc nor psutil is available.
    """
    _trim_heap()
    sample = _statm_bytes
    if sample() is None:
        try:
            import psutil
        except ImportError:
            fn()
            return math.nan, math.nan
        proc = psutil.Process()

        def sample() -> tuple[int, int]:
            info = proc.memory_full_info()
            return info.rss, getattr(info, "uss", info.rss)

    base_rss, base_anon = sample()
    peak = [base_rss, base_anon]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            rss, anon = sample()
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)
            time.sleep(0.001)

    exact = _reset_hwm()
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    result = fn()
    stop.set()
    thread.join()
    rss, anon = sample()
    peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)
    if exact and (hwm := _hwm_bytes()) is not None:
        peak[0] = max(peak[0], hwm)
    del result
    return float(peak[0] - base_rss), float(peak[1] - base_anon)


# ----- weights ------------------------------------------------------------------------------------------


def llama_config(size: str | dict[str, int]) -> dict[str, Any]:
    """A llama config.json dict for a size name of :data:`SIZES` (or explicit widths, for tests)."""
    widths = SIZES[size] if isinstance(size, str) else size
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 2048,
            "tie_word_embeddings": False, "rms_norm_eps": 1e-5, **widths}


def build_checkpoint(folder: Path, config: dict[str, Any], *, dtype: str = "bf16", shards: int = 2) -> Path:
    """A random-init llama checkpoint written by transformers' ``save_pretrained`` (about ``shards`` files);
    reused when ``folder`` already holds a complete one."""
    folder = Path(folder)
    if (folder / ".complete").exists():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaConfig(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    model = LlamaForCausalLM(hf).to(getattr(torch, DTYPES[dtype]))
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    kwargs = {"max_shard_size": total // shards + 1} if shards > 1 else {"max_shard_size": 2 * total}
    model.save_pretrained(folder, **kwargs)
    (folder / ".complete").write_text("")
    return folder


def checkpoint_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


def checkpoint_bytes(folder: Path) -> int:
    """Bytes of tensor data in the checkpoint (headers excluded): what every loader reads."""
    from aegis.train.weights import CheckpointReader

    return CheckpointReader(folder).total_bytes()


def warm_page_cache(files: Sequence[Path]) -> int:
    """Read every file once, so each loader reads from the page cache and none pays the first disk read."""
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                n += len(chunk)
    return n


def weight_loaders(folder: Path) -> dict[str, Callable[[], Any]]:
    """Name -> a callable loading every tensor of ``folder`` (blocking until arrays are ready)."""
    import jax
    import jax.numpy as jnp
    from safetensors import safe_open
    from safetensors.numpy import load_file

    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    files = checkpoint_files(folder)
    config = json.loads((Path(folder) / "config.json").read_text())
    stored = jnp.dtype(config.get("torch_dtype") or config.get("dtype") or "float32")
    model = build_model(config, dtype=stored, param_dtype=stored)

    def st_load_file() -> dict:
        return {k: v for f in files for k, v in load_file(f).items()}

    def st_safe_open() -> dict:
        out = {}
        for f in files:
            with safe_open(f, framework="numpy") as h:
                for k in h.keys():
                    out[k] = h.get_tensor(k)
        return out

    def st_device_put() -> dict:
        out = {}
        for f in files:
            with safe_open(f, framework="numpy") as h:
                for k in h.keys():
                    out[k] = jax.device_put(h.get_tensor(k))
        return jax.block_until_ready(out)

    def aegis(dtype: Any = None, nf4: bool = False) -> Callable[[], Any]:
        return lambda: jax.block_until_ready(load_checkpoint(model, folder, dtype=dtype or stored, nf4=nf4,
                                                             on_progress=None))

    loaders = {
        "safetensors.numpy.load_file": st_load_file,
        "safe_open, every tensor": st_safe_open,
        BASELINE_WEIGHTS: st_device_put,
        f"aegis load_checkpoint ({stored.name})": aegis(),
    }
    if stored != jnp.float32:
        loaders["aegis load_checkpoint (-> float32)"] = aegis(jnp.float32)
    loaders["aegis load_checkpoint (nf4=True)"] = aegis(nf4=True)
    return loaders


def bench_weights(folder: Path, *, repeat: int = 3, pause: float = 0.2) -> list[dict[str, Any]]:
    """One row per loader: median seconds over ``repeat`` interleaved rounds (after one untimed warm-up call,
    which also compiles the NF4 kernels), GB/s, the ratio to :data:`BASELINE_WEIGHTS`, and the peak RSS
    growth of one more call."""
    nbytes = checkpoint_bytes(folder)
    warm_page_cache(checkpoint_files(folder))
    loaders = weight_loaders(folder)
    for fn in loaders.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(repeat):
        for name, fn in loaders.items():
            _trim_heap()
            time.sleep(pause)
            t0 = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - t0)
            del result
    rows = []
    for name, fn in loaders.items():
        rss, anon = peak_rss_growth(fn)
        seconds = statistics.median(times[name])
        rows.append({"loader": name, "seconds": seconds, "gb_per_s": nbytes / seconds / 1e9,
                     "peak_rss_bytes": rss, "peak_anon_bytes": anon})
    base = next(r for r in rows if r["loader"] == BASELINE_WEIGHTS)
    for r in rows:
        r["ratio"] = r["gb_per_s"] / base["gb_per_s"]
    return rows


def weights_table(rows: list[dict[str, Any]]) -> str:
    mb = 1 / 2**20
    lines = [f"{'loader':<38}{'median s':>10}{'GB/s':>8}{'vs device_put':>15}{'peak RSS +MiB':>15}"
             f"{'peak anon +MiB':>16}"]
    for r in rows:
        lines.append(f"{r['loader']:<38}{r['seconds']:>10.3f}{r['gb_per_s']:>8.2f}{r['ratio']:>14.2f}x"
                     f"{r['peak_rss_bytes'] * mb:>15.0f}{r['peak_anon_bytes'] * mb:>16.0f}")
    return "\n".join(lines)


# ----- sharded loading ----------------------------------------------------------------------------------


def sharded_loaders(folder: Path, mesh_axes: dict[str, int]) -> dict[str, Callable[[], Any]]:
    """Name -> a callable loading ``folder`` onto a mesh of ``mesh_axes``: whole parameters then ``device_put``
    (before) and streamed into the shards (:class:`aegis.train.weights.Placement`)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from aegis.train.modeling import build_model
    from aegis.train.parallel import ParallelConfig
    from aegis.train.sharding import ShardingRules, make_mesh
    from aegis.train.weights import Placement, load_checkpoint

    config = json.loads((Path(folder) / "config.json").read_text())
    stored = jnp.dtype(config.get("torch_dtype") or config.get("dtype") or "float32")
    model = build_model(config, dtype=stored, param_dtype=stored)
    mesh, _ = make_mesh(ParallelConfig(**mesh_axes))
    rules = ShardingRules.for_model(model, mesh)

    def sharding(path: tuple[str, ...], shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(mesh, rules.spec(path, shape))

    def whole() -> Any:
        return jax.block_until_ready(load_checkpoint(model, folder, place=lambda p, a: jax.device_put(a, sharding(p, a.shape))))

    def streamed() -> Any:
        return jax.block_until_ready(load_checkpoint(model, folder, place=Placement(sharding)))

    return {BASELINE_SHARDED: whole, "streamed into shards (Placement)": streamed}


def _sharded_peak(folder: str, mesh_axes: dict[str, int], name: str) -> tuple[float, float, float]:
    """In a fresh process, loads by loader ``name`` after an untimed one: :func:`peak_rss_growth`, and the numpy
    memory the load held only while it ran (tracemalloc's peak above what it ends holding: the loaded arrays that
    alias host buffers on CPU excluded)."""
    import tracemalloc

    fn = sharded_loaders(Path(folder), mesh_axes)[name]
    fn()
    rss, anon = peak_rss_growth(fn)
    _trim_heap()
    tracemalloc.start()
    try:
        result = fn()
        held, peak = tracemalloc.get_traced_memory()
        del result
    finally:
        tracemalloc.stop()
    return rss, anon, float(peak - held)


def bench_sharded(folder: Path, mesh_axes: dict[str, int], *, repeat: int = 3) -> list[dict[str, Any]]:
    """One row per loader: median seconds over ``repeat`` interleaved rounds; from a fresh process each, the peak
    RSS / anonymous growth of a load and the numpy memory it held only while loading, with that transient's ratio
    to :data:`BASELINE_SHARDED`'s."""
    warm_page_cache(checkpoint_files(folder))
    loaders = sharded_loaders(folder, mesh_axes)
    for fn in loaders.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(repeat):
        for name, fn in loaders.items():
            _trim_heap()
            t0 = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - t0)
            del result
    del loaders
    rows = []
    for name in times:
        import multiprocessing

        # a fresh process per loader (spawned: it inherits XLA_FLAGS), so no loader's peak hides in the heap another
        # one left behind; one untimed load there first
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            rss, anon, transient = pool.apply(_sharded_peak, (str(folder), mesh_axes, name))
        rows.append({"loader": name, "seconds": statistics.median(times[name]), "peak_rss_bytes": rss,
                     "peak_anon_bytes": anon, "transient_bytes": transient})
    base = next(r for r in rows if r["loader"] == BASELINE_SHARDED)
    for r in rows:
        r["transient_ratio"] = r["transient_bytes"] / base["transient_bytes"]
    return rows


def sharded_table(rows: list[dict[str, Any]]) -> str:
    mb = 1 / 2**20
    lines = [f"{'loader':<40}{'median s':>10}{'peak RSS +MiB':>15}{'peak anon +MiB':>16}{'numpy transient MiB':>21}"
             f"{'vs before':>11}"]
    for r in rows:
        lines.append(f"{r['loader']:<40}{r['seconds']:>10.3f}{r['peak_rss_bytes'] * mb:>15.0f}"
                     f"{r['peak_anon_bytes'] * mb:>16.0f}{r['transient_bytes'] * mb:>21.1f}{r['transient_ratio']:>10.2f}x")
    return "\n".join(lines)


# ----- tokenisation -------------------------------------------------------------------------------------


def _vocabulary(rng: random.Random, n: int = 3000) -> list[str]:
    common = ("the a to and of you your is it for on in please thanks account password order refund email "
              "support update settings payment plan help issue click reset").split()
    made = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 10))) for _ in range(n)]
    return common * 20 + made


def _sentence(rng: random.Random, words: list[str], lo: int, hi: int) -> str:
    out = []
    for _ in range(rng.randint(lo, hi)):
        out.append(rng.choice(words))
        if rng.random() < 0.08:
            out[-1] += rng.choice([".", ",", "?", "!", ".\n", ":\n- "])
    return " ".join(out)


def make_sharegpt_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` ShareGPT rows of 2-6 alternating human/gpt turns."""
    rng = random.Random(seed)
    words = _vocabulary(random.Random(seed + 1))
    rows = []
    for _ in range(n):
        turns = [{"from": "human", "value": _sentence(rng, words, 5, 60)} if i % 2 == 0 else
                 {"from": "gpt", "value": _sentence(rng, words, 10, 150)} for i in range(rng.randint(2, 6))]
        rows.append({"conversations": turns})
    return rows


def make_tokenizer_folders(folder: Path, vocab_size: int = 4096) -> tuple[Path, Path]:
    """Two tokenizer folders with one byte-level BPE trained here: ChatML with ``{% generation %}`` tags, and
    plain ChatML (the same rendered text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(2)
    words = _vocabulary(random.Random(1))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((_sentence(rng, words, 5, 40) for _ in range(4000)), trainer)
    out = []
    for name, template in (("chatml-generation", CHATML_GENERATION), ("chatml", CHATML)):
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                       pad_token="<|pad|>")
        fast.chat_template = template
        fast.save_pretrained(folder / name)
        out.append(folder / name)
    return out[0], out[1]


def tokenize_methods(gen_folder: Path, plain_folder: Path) -> dict[str, Callable[[list, list], tuple[int, int]]]:
    """Name -> fn(turns of each row, messages of each row) -> (tokens, assistant-mask tokens or -1)."""
    from aegis.data.render import ChatRenderer

    gen = ChatRenderer.from_folder(gen_folder)
    plain = ChatRenderer.from_folder(plain_folder)
    assert gen.generation_tags and not plain.generation_tags
    hf_gen, hf_plain = gen.tokenizer, plain.tokenizer

    def render(renderer: ChatRenderer) -> Callable[[list, list], tuple[int, int]]:
        def run(turns: list, messages: list) -> tuple[int, int]:
            out = [renderer.render(t) for t in turns]
            return sum(len(ids) for ids, _ in out), sum(sum(mask) for _, mask in out)

        return run

    def hf_mask(turns: list, messages: list) -> tuple[int, int]:
        out = [hf_gen.apply_chat_template(m, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
               for m in messages]
        return sum(len(o["input_ids"]) for o in out), sum(sum(o["assistant_masks"]) for o in out)

    def ids_of(out: Any) -> Any:  # transformers 5 returns a BatchEncoding by default, 4 a list of ids
        return out["input_ids"] if isinstance(out, Mapping) else out

    def hf_plain_ids(turns: list, messages: list) -> tuple[int, int]:
        return sum(len(ids_of(hf_plain.apply_chat_template(m, tokenize=True))) for m in messages), -1

    def hf_batched(turns: list, messages: list) -> tuple[int, int]:
        return sum(len(ids) for ids in ids_of(hf_plain.apply_chat_template(messages, tokenize=True))), -1

    return {
        "aegis render(), {% generation %} tags": render(gen),
        "aegis render(), no tags (prefixes)": render(plain),
        "aegis lengths(), batched": lambda turns, messages: (sum(plain.lengths(turns)), -1),
        BASELINE_TOKENIZE: hf_mask,
        "transformers apply_chat_template": hf_plain_ids,
        "transformers apply_chat_template, batch": hf_batched,
    }


def bench_tokenize(rows: int = 10_000, *, chunks: int = 5, folder: Path | None = None) -> list[dict[str, Any]]:
    """One row per method: rows/s, the median over ``chunks`` slices of the rows (every method runs every
    slice in turn, after an untimed warm-up on a few rows), the ratio to :data:`BASELINE_TOKENIZE`, and the
    total tokens and assistant-mask tokens it produced over all rows."""
    from aegis.data.reading import to_conversation

    data = make_sharegpt_rows(rows)
    turns = [to_conversation(r, "sharegpt", "conversations") for r in data]
    messages = [[{"role": role, "content": content} for role, content in t] for t in turns]
    with tempfile.TemporaryDirectory() as tmp:
        methods = tokenize_methods(*make_tokenizer_folders(Path(folder or tmp)))
        for fn in methods.values():
            fn(turns[:20], messages[:20])
        size = -(-rows // chunks)
        rates: dict[str, list[float]] = {name: [] for name in methods}
        totals = {name: [0, 0] for name in methods}
        for start in range(0, rows, size):
            part = slice(start, start + size)
            n = len(turns[part])
            for name, fn in methods.items():
                t0 = time.perf_counter()
                tokens, masked = fn(turns[part], messages[part])
                rates[name].append(n / (time.perf_counter() - t0))
                totals[name][0] += tokens
                totals[name][1] += masked
    out = [{"method": name, "rows_per_s": statistics.median(rates[name]), "tokens": totals[name][0],
            "assistant_tokens": totals[name][1] if totals[name][1] >= 0 else None} for name in methods]
    base = next(r for r in out if r["method"] == BASELINE_TOKENIZE)
    for r in out:
        r["ratio"] = r["rows_per_s"] / base["rows_per_s"]
    return out


def tokenize_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'method':<42}{'rows/s':>9}{'vs HF + mask':>14}{'tokens':>12}{'assistant tok':>15}"]
    for r in rows:
        masked = "-" if r["assistant_tokens"] is None else f"{r['assistant_tokens']:,}"
        lines.append(f"{r['method']:<42}{r['rows_per_s']:>9,.0f}{r['ratio']:>13.2f}x{r['tokens']:>12,}{masked:>15}")
    return "\n".join(lines)


# ----- main ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small", help="llama checkpoint size (default small)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="checkpoint dtype (default bf16)")
    ap.add_argument("--shards", type=int, default=2, help="about this many safetensors files (max_shard_size)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved timing rounds per loader (median)")
    ap.add_argument("--rows", type=int, default=10_000, help="chat rows to tokenise")
    ap.add_argument("--chunks", type=int, default=5, help="interleaved slices of the rows (median)")
    ap.add_argument("--only", choices=["weights", "sharded", "tokenize"], help="run one part")
    ap.add_argument("--devices", type=int, default=4, help="forced host devices for the sharded part (default 4)")
    ap.add_argument("--mesh", default="fsdp=4", help="mesh axes of the sharded part, e.g. data=2,fsdp=2")
    ap.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "aegis-bench-loading",
                    help="where the checkpoint is built once and reused")
    args = ap.parse_args(argv)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"CPU ({os.cpu_count()} cores, load average {load})")

    if args.only == "sharded":  # XLA reads the device count when JAX starts: before the first import of jax
        flag = f"--xla_force_host_platform_device_count={args.devices}"
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), flag]).strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.only in (None, "weights", "sharded"):
        import jax

        folder = args.cache_dir / f"llama-{args.size}-{args.dtype}-{args.shards}shards"
        t0 = time.perf_counter()
        built = not (folder / ".complete").exists()
        build_checkpoint(folder, llama_config(args.size), dtype=args.dtype, shards=args.shards)
        from aegis.train.weights import CheckpointReader

        n_params = sum(math.prod(CheckpointReader(folder).shape(k)) for k in CheckpointReader(folder).names())
        nbytes = checkpoint_bytes(folder)
        print(f"\nweights: {args.size} llama, {n_params / 1e6:.0f}M params, {args.dtype}, {nbytes / 1e9:.2f} GB in "
              f"{len(checkpoint_files(folder))} safetensors files ({'built' if built else 'cached'} in {folder}"
              f"{f', {time.perf_counter() - t0:.0f} s' if built else ''}); jax {jax.__version__} on "
              f"{jax.devices()[0].platform}")
        print(f"files read once before timing (page cache warm: no loader pays the disk); median of {args.repeat} "
              "interleaved rounds after one warm-up; peak RSS growth of one more load, the loaded arrays included "
              "(on CPU the device is host memory), anon = allocated, the rest mapped file pages")
        if args.only != "sharded":
            print(weights_table(bench_weights(folder, repeat=args.repeat)))
        if args.only == "sharded" or (args.only is None and len(jax.devices()) > 1):
            mesh_axes = {k: int(v) for k, v in (part.split("=") for part in args.mesh.split(","))}
            print(f"\nsharded load on {len(jax.devices())} {jax.devices()[0].platform} devices, mesh {mesh_axes}")
            print(sharded_table(bench_sharded(folder, mesh_axes, repeat=args.repeat)))

    if args.only in (None, "tokenize"):
        import transformers

        print(f"\ntokenisation: {args.rows:,} ShareGPT rows (2-6 turns), byte-level BPE (4,096 tokens, trained here), "
              f"ChatML; transformers {transformers.__version__}; median rows/s over {args.chunks} interleaved slices")
        print(tokenize_table(bench_tokenize(args.rows, chunks=args.chunks)))


if __name__ == "__main__":
    main()
