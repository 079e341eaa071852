"""tools/bench/bench_loading: both halves run end to end at tiny sizes (no timing assertions)."""

from __future__ import annotations

import math

import pytest

from tools.bench import bench_loading

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256}


@pytest.mark.slow  # ~20 s: imports torch, transformers and JAX, builds a checkpoint, compiles the NF4 kernels
def test_weights_table_has_every_loader_with_positive_rates(tmp_path):
    folder = bench_loading.build_checkpoint(tmp_path / "ckpt", bench_loading.llama_config(TINY), dtype="bf16", shards=2)
    assert len(bench_loading.checkpoint_files(folder)) >= 2  # sharded, with an index
    assert bench_loading.build_checkpoint(folder, {}) == folder  # reused, not rebuilt
    rows = bench_loading.bench_weights(folder, repeat=1, pause=0.0)
    assert [r["loader"] for r in rows] == [
        "safetensors.numpy.load_file",
        "safe_open, every tensor",
        bench_loading.BASELINE_WEIGHTS,
        "aegis load_checkpoint (bfloat16)",
        "aegis load_checkpoint (-> float32)",
        "aegis load_checkpoint (nf4=True)",
    ]
    for r in rows:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
        assert math.isfinite(r["gb_per_s"]) and r["gb_per_s"] > 0
        assert not r["peak_rss_bytes"] < 0 and not r["peak_anon_bytes"] < 0  # NaN only without /proc or psutil
    assert next(r for r in rows if r["loader"] == bench_loading.BASELINE_WEIGHTS)["ratio"] == 1.0
    table = bench_loading.weights_table(rows).splitlines()
    assert "GB/s" in table[0] and len(table) == 1 + len(rows)
    assert all(any(line.startswith(r["loader"]) for line in table) for r in rows)


def test_tokenize_table_has_every_method_and_they_agree_on_tokens(tmp_path):
    rows = bench_loading.bench_tokenize(30, chunks=2, folder=tmp_path)
    names = [r["method"] for r in rows]
    assert names == [
        "aegis render(), {% generation %} tags",
        "aegis render(), no tags (prefixes)",
        "aegis lengths(), batched",
        bench_loading.BASELINE_TOKENIZE,
        "transformers apply_chat_template",
        "transformers apply_chat_template, batch",
    ]
    for r in rows:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
    assert len({r["tokens"] for r in rows}) == 1 and rows[0]["tokens"] > 0  # the two templates render the same ids
    by_name = {r["method"]: r for r in rows}
    assert by_name[names[0]]["assistant_tokens"] == by_name[bench_loading.BASELINE_TOKENIZE]["assistant_tokens"] > 0
    table = bench_loading.tokenize_table(rows).splitlines()
    assert "rows/s" in table[0] and len(table) == 1 + len(rows)


def test_cli_runs_the_tokenize_half(capsys):
    bench_loading.main(["--only", "tokenize", "--rows", "12", "--chunks", "2"])
    out = capsys.readouterr().out
    assert "12 ShareGPT rows" in out and bench_loading.BASELINE_TOKENIZE in out and "GB/s" not in out
