"""Rebuild the bundled model catalog from library data: ``sdk/aegis/models/catalog/models.json`` and ``models/*.json``.

The rows are in `tools.catalog_sources`. A vendored row is a real Hub config.json, kept byte for byte;
every other row is converted here from a pinned library's model table into the config.json transformers
would read for that ``model_type``; a github row is a config.json another repository keeps, also kept as is:

  litgpt 0.5.13     ``litgpt/config.py`` ``configs``: n_layer, n_embd, n_head, n_query_groups, head_size,
                    intermediate_size, padded_vocab_size, block_size, rope_base, rope_adjustments, norm_eps,
                    attn_bias, n_expert, sliding_window_size, softcaps, ...
  torchtune 0.6.1   ``models/qwen2{,_5}/_model_builders.py``: the builder's keyword arguments

Keys the source does not hold (activation, dropout, initializer range, the tie flag unless the row sets
it) take transformers' defaults for the model_type; keys a row sets itself are recorded with the reason
in the entry's ``source.overrides``. Aliases are not written: the catalog derives them (one rule).

    python -m tools.import_catalog                  # pip-downloads the two wheels (no deps), rewrites the catalog
    python -m tools.import_catalog --litgpt W.whl --torchtune W.whl
    python -m tools.import_catalog --check          # exit 1 when the committed catalog differs
    python -m tools.import_catalog --compare-vendored   # litgpt's view of the vendored Hub configs, key by key

Entries of models.json that no row here produces (added by hand or by another tool) are kept, in place, with
their files: the rebuild merges, it never drops what it does not know.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.catalog_sources import GITHUB, LITGPT, ROWS, TORCHTUNE, VENDORED

CATALOG = Path(__file__).resolve().parents[1] / "sdk" / "aegis" / "models" / "catalog"
PINS = {LITGPT: "0.5.13", TORCHTUNE: "0.6.1"}

_ARCH_BY_FAMILY = {
    "llama-2": "llama", "llama-3": "llama", "llama-3.1": "llama", "llama-3.2": "llama", "llama-3.3": "llama",
    "llama-3.1-nemotron": "llama", "codellama": "llama", "tinyllama": "llama", "smollm2": "llama", "falcon3": "llama",
    "salamandra": "llama", "open-llama": "llama", "microllama": "llama", "freewilly2": "llama", "platypus2": "llama",
    "mistral": "mistral", "mathstral": "mistral", "mistral-large": "mistral",
    "mixtral": "mixtral", "qwen2": "qwen2", "qwen2.5": "qwen2", "qwq": "qwen2", "qwen3": "qwen3",
    "gemma-2": "gemma2", "gemma-3": "gemma3_text", "phi-3": "phi3", "phi-3.5": "phi3", "phi-4": "phi3",
    "gemma": "gemma", "codegemma": "gemma", "olmo-2": "olmo2", "stablelm": "stablelm", "olmo": "olmo",
}
_CLASS = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM",
    "gemma": "GemmaForCausalLM", "olmo2": "Olmo2ForCausalLM", "stablelm": "StableLmForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM", "falcon": "FalconForCausalLM", "olmo": "OlmoForCausalLM",
}


@dataclass(frozen=True)
class Shape:
    """What a source says about one model, in one vocabulary."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    rope_theta: float
    eps: float
    tied: bool = False
    rope: dict[str, Any] | None = None
    partial_rotary: float = 1.0
    sliding_window: int | None = None
    experts: int = 0
    top_k: int = 0
    expert_width: int = 0
    query_pre_attn_scalar: int | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    rope_local_base: float | None = None
    bias: bool = False
    parallel_residual: bool = False
    hidden_act: str | None = None
    """Where a source names the MLP's activation and the family has a choice (GPT-NeoX: gelu, gelu_fast)."""
    shared_norm: bool = True
    """A parallel block's attention and MLP read one LayerNorm (Falcon-7B); False: each its own (Falcon-40B)."""


# ------------------------------------------------------------------------------------------- sources


def _wheel(package: str, given: Path | None, workdir: Path) -> Path:
    if given is not None:
        return given
    subprocess.run([sys.executable, "-m", "pip", "download", f"{package}=={PINS[package]}", "--no-deps", "-q",
                    "-d", str(workdir)], check=True)
    return next(workdir.glob(f"{package}-{PINS[package]}-*.whl"))


def litgpt_configs(wheel: Path) -> dict[str, Any]:
    """name → litgpt ``Config`` (its __post_init__ fills head_size, n_query_groups, padded vocab)."""
    source = zipfile.ZipFile(wheel).read("litgpt/config.py").decode()
    module = types.ModuleType("litgpt_config")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(compile(source, "litgpt/config.py", "exec"), module.__dict__)  # a data module: imports yaml only
    finally:
        del sys.modules[module.__name__]
    return {c["name"]: module.Config(**c) for c in module.configs}


def torchtune_builders(wheel: Path) -> dict[str, dict[str, Any]]:
    """builder name → its literal keyword arguments (qwen2 and qwen2_5 builders)."""
    builders: dict[str, dict[str, Any]] = {}
    with zipfile.ZipFile(wheel) as zf:
        for path in ("torchtune/models/qwen2/_model_builders.py", "torchtune/models/qwen2_5/_model_builders.py"):
            for node in ast.parse(zf.read(path).decode()).body:
                if not isinstance(node, ast.FunctionDef):
                    continue
                ret = next((n for n in ast.walk(node) if isinstance(n, ast.Return)), None)
                if ret is None or not isinstance(ret.value, ast.Call):
                    continue
                kwargs = {}
                for kw in ret.value.keywords:
                    try:
                        kwargs[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        continue
                if "vocab_size" in kwargs:
                    builders[node.name] = kwargs
    return builders


def shape_from_litgpt(c: Any) -> Shape:
    rope = None
    adj = c.rope_adjustments
    if adj and "low_freq_factor" in adj:
        rope = {"factor": float(adj["factor"]), "high_freq_factor": float(adj["high_freq_factor"]),
                "low_freq_factor": float(adj["low_freq_factor"]),
                "original_max_position_embeddings": adj["original_max_seq_len"], "rope_type": "llama3"}
    elif adj or c.rope_condense_ratio != 1:
        rope = {"factor": float(adj["factor"] if adj else c.rope_condense_ratio), "rope_type": "linear"}
    return Shape(
        hidden=c.n_embd, layers=c.n_layer, heads=c.n_head, kv_heads=c.n_query_groups, head_dim=c.head_size,
        intermediate=c.intermediate_size, vocab=c.padded_vocab_size, max_positions=c.block_size,
        rope_theta=float(c.rope_base), eps=float(c.norm_eps), rope=rope, partial_rotary=float(c.rotary_percentage),
        sliding_window=c.sliding_window_size, experts=c.n_expert, top_k=c.n_expert_per_token,
        expert_width=c.moe_intermediate_size or (c.intermediate_size if c.n_expert else 0),
        query_pre_attn_scalar=c.attention_scores_scalar, attn_softcap=c.attention_logit_softcapping,
        final_softcap=c.final_logit_softcapping,
        rope_local_base=None if c.rope_local_base_freq is None else float(c.rope_local_base_freq),
        bias=bool(c.bias), parallel_residual=bool(c.parallel_residual),
        hidden_act=_LITGPT_GELU.get(c.gelu_approximate) if c.mlp_class_name == "GptNeoxMLP" else None,
        shared_norm=bool(c.shared_attention_norm) or not c.parallel_residual,
    )


_LITGPT_GELU = {"none": "gelu", "tanh": "gelu_pytorch_tanh"}
"""litgpt's GptNeoxMLP ``gelu(x, approximate=...)`` as transformers names the activation."""


def shape_from_torchtune(b: dict[str, Any]) -> Shape:
    return Shape(
        hidden=b["embed_dim"], layers=b["num_layers"], heads=b["num_heads"], kv_heads=b["num_kv_heads"],
        head_dim=b.get("head_dim") or b["embed_dim"] // b["num_heads"], intermediate=b["intermediate_dim"],
        vocab=b["vocab_size"], max_positions=b["max_seq_len"], rope_theta=float(b["rope_base"]),
        eps=float(b["norm_eps"]), tied=bool(b.get("tie_word_embeddings", False)),
    )


# ------------------------------------------------------------------------------------------ convert


def hf_config(arch: str, s: Shape) -> dict[str, Any]:
    """The config.json transformers reads for ``arch`` (a model_type), from a `Shape`."""
    if arch == "qwen3" and s.experts:
        arch = "qwen3_moe"
    c: dict[str, Any] = {
        "architectures": [_CLASS[arch]], "model_type": arch, "hidden_size": s.hidden,
        "intermediate_size": s.intermediate, "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "vocab_size": s.vocab,
        "max_position_embeddings": s.max_positions, "rope_theta": s.rope_theta, "rms_norm_eps": s.eps,
        "tie_word_embeddings": s.tied, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    }
    if arch in ("gemma2", "gemma3_text"):
        c.update(hidden_activation="gelu_pytorch_tanh", attention_bias=False, sliding_window=s.sliding_window,
                 query_pre_attn_scalar=s.query_pre_attn_scalar, attn_logit_softcapping=s.attn_softcap,
                 final_logit_softcapping=s.final_softcap, tie_word_embeddings=True)
        if arch == "gemma3_text":
            c.update(rope_local_base_freq=s.rope_local_base, rope_scaling=s.rope, sliding_window_pattern=6)
        return c
    if arch == "gemma":
        c.update(hidden_act="gelu_pytorch_tanh", attention_bias=False, tie_word_embeddings=True)
        return c
    if arch == "falcon":  # FalconConfig's keys, as the Falcon Hub files write them
        two_norms = s.parallel_residual and not s.shared_norm  # new_decoder_architecture: ln_attn and ln_mlp
        out: dict[str, Any] = {
            "alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": [_CLASS[arch]],
            "attention_dropout": 0.0, "bias": s.bias, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
            "hidden_size": s.hidden, "initializer_range": 0.02, "layer_norm_epsilon": s.eps, "model_type": arch,
            **({} if two_norms else {"multi_query": s.kv_heads == 1}), "new_decoder_architecture": two_norms,
            "num_attention_heads": s.heads, "num_hidden_layers": s.layers,
            **({"num_kv_heads": s.kv_heads} if two_norms else {}), "parallel_attn": s.parallel_residual,
            "use_cache": True, "vocab_size": s.vocab,
        }
        if s.intermediate != 4 * s.hidden:
            out["ffn_hidden_size"] = s.intermediate
        if s.max_positions != 2048:
            out["max_position_embeddings"] = s.max_positions
        if s.rope_theta != 10_000:
            out["rope_theta"] = s.rope_theta
        return out
    if arch == "gpt_neox":  # GPTNeoXConfig's keys, as Pythia's Hub files spell them (no kv heads or head_dim)
        for key in ("head_dim", "rms_norm_eps", "num_key_value_heads", "rope_theta", "attention_dropout"):
            del c[key]
        theta = int(s.rope_theta) if s.rope_theta == int(s.rope_theta) else s.rope_theta
        c.update(layer_norm_eps=s.eps, rotary_pct=s.partial_rotary, rotary_emb_base=theta,
                 use_parallel_residual=s.parallel_residual, hidden_act=s.hidden_act or "gelu", bos_token_id=0,
                 eos_token_id=0)
        return c
    if arch == "stablelm":  # StableLmConfig's keys: LayerNorm epsilon, partial rotation, the two layout switches
        for key in ("head_dim", "rms_norm_eps"):
            del c[key]
        c.update(layer_norm_eps=s.eps, partial_rotary_factor=s.partial_rotary, use_qkv_bias=s.bias,
                 qk_layernorm=False, use_parallel_residual=s.parallel_residual, hidden_act="silu",
                 hidden_dropout=0.0)
        return c
    if arch == "olmo":  # OlmoConfig's keys, as transformers' converter writes them: no head_dim, no norm epsilon
        for key in ("head_dim", "rms_norm_eps"):  # (OlmoLayerNorm's is fixed at 1e-5)
            del c[key]
        c.update(attention_bias=False, clip_qkv=None, hidden_act="silu", pad_token_id=1, eos_token_id=50279,
                 rope_scaling=s.rope)
        return c
    c["hidden_act"] = "silu"
    if arch == "llama":
        c.update(attention_bias=False, mlp_bias=False, rope_scaling=s.rope, pretraining_tp=1)
    elif arch == "mistral":
        c.update(sliding_window=s.sliding_window)
    elif arch == "mixtral":
        c.update(num_local_experts=s.experts, num_experts_per_tok=s.top_k, sliding_window=s.sliding_window,
                 router_aux_loss_coef=0.02, output_router_logits=False)
    elif arch in ("qwen2", "qwen3", "qwen3_moe"):
        c.update(use_sliding_window=False, rope_scaling=s.rope)
        if arch != "qwen2":
            c.update(attention_bias=False)
        if arch == "qwen3_moe":
            c.update(num_experts=s.experts, num_experts_per_tok=s.top_k, moe_intermediate_size=s.expert_width,
                     norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001,
                     output_router_logits=False)
    elif arch == "olmo2":
        c.update(attention_bias=False, rope_scaling=s.rope)
    elif arch == "phi3":
        # litgpt keeps Phi-3's window one larger than config.json does (Phi-3-mini-4k: 2048 vs the Hub's 2047)
        c.update(sliding_window=s.sliding_window - 1 if s.sliding_window else None, rope_scaling=None)
        if s.partial_rotary != 1.0:
            c["partial_rotary_factor"] = s.partial_rotary
    return c


def file_name(hub_id: str) -> str:
    return hub_id.replace("/", "--") + ".json"


def _source(row: dict[str, Any], overrides: dict[str, str]) -> dict[str, Any]:
    kind, entry = row["source"]
    if kind == VENDORED:
        return {"library": "hub", "version": "", "entry": f"{row['ids'][0]}/config.json", "overrides": overrides}
    if kind == GITHUB:  # owner/repo@commit:path#key
        where, _, path = entry.partition(":")
        repo, _, commit = where.partition("@")
        return {"library": "github", "version": commit, "entry": f"{repo}:{path}", "overrides": overrides}
    return {"library": kind, "version": PINS[kind], "entry": entry, "overrides": overrides}


def build(litgpt: dict[str, Any], torchtune: dict[str, dict[str, Any]]) -> tuple[list[dict], dict[str, dict]]:
    """(models.json rows, file name → generated config) for every row of catalog_sources."""
    index: list[dict[str, Any]] = []
    files: dict[str, dict[str, Any]] = {}
    for row in ROWS:
        kind, entry = row["source"]
        overrides = {k: why for k, (_, why) in row["set"].items()}
        if kind == VENDORED:
            name = entry
        elif kind == GITHUB:
            name = file_name(row["ids"][0])  # the repository's copy, kept as written there
        else:
            shape = shape_from_litgpt(litgpt[entry]) if kind == LITGPT else shape_from_torchtune(torchtune[entry])
            config = hf_config(row["arch"] or _ARCH_BY_FAMILY[row["family"]], shape)
            for k, (value, _) in row["set"].items():
                config[k] = value
            name = file_name(row["ids"][0])
            files[name] = config
        index.append({
            "id": row["ids"][0], "also_ids": list(row["ids"][1:]), "file": name, "family": row["family"],
            "size": row["size"], "variant": row["variant"], "source": _source(row, overrides),
            "published": row["published"], "note": row["note"],
            **({"sole_size": row["sole_size"]} if row["sole_size"] else {}),
        })
    return index, files


def merge(index: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``index`` with every entry of ``current`` (the committed models.json) that no row produces kept at its place:
    each kept entry follows the entry it follows now."""
    ours = {row["id"] for row in index}
    merged = list(index)
    after: str | None = None
    for row in current:
        if row["id"] in ours:
            after = row["id"]
            continue
        at = next((i + 1 for i, r in enumerate(merged) if r["id"] == after), 0) if after else 0
        merged.insert(at, row)
        after = row["id"]
    return merged


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=isinstance(data, dict)) + "\n"


def compare_vendored(litgpt: dict[str, Any]) -> list[str]:
    """Key-by-key differences between litgpt's converted config and each vendored Hub config it also lists."""
    by_hf = {f"{c.hf_config['org']}/{c.hf_config['name']}": c for c in litgpt.values()}
    lines = []
    for row in ROWS:
        if row["source"][0] != VENDORED:
            continue
        hub = json.loads((CATALOG / "models" / row["source"][1]).read_text())
        names = (*row["ids"], *(i.replace("/", "/Meta-") for i in row["ids"]))  # litgpt keeps the old Meta- names
        match = next((by_hf[i] for i in names if i in by_hf), None)
        if match is None:
            lines.append(f"{row['ids'][0]}: not in litgpt")
            continue
        ours = hf_config(_ARCH_BY_FAMILY.get(row["family"], hub["model_type"]), shape_from_litgpt(match))
        diffs = [f"{k}: hub {hub.get(k)!r} litgpt {v!r}" for k, v in ours.items()
                 if k in hub and hub.get(k) != v and k not in ("architectures", "model_type")]
        lines.append(f"{row['ids'][0]}: " + ("same" if not diffs else "; ".join(diffs)))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--litgpt", type=Path, help=f"litgpt {PINS[LITGPT]} wheel (default: pip download)")
    parser.add_argument("--torchtune", type=Path, help=f"torchtune {PINS[TORCHTUNE]} wheel (default: pip download)")
    parser.add_argument("--check", action="store_true", help="compare with the committed catalog; write nothing")
    parser.add_argument("--compare-vendored", action="store_true", help="print litgpt vs the vendored Hub configs")
    parser.add_argument("--names", action="store_true",
                        help="only rewrite names.json (the name index) for the committed models.json")
    args = parser.parse_args(argv)
    if args.names:
        from aegis.models import catalog

        text = catalog.name_index((CATALOG / "models.json").read_text())
        (CATALOG / "names.json").write_text(text)
        print("names.json written for the committed models.json")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        litgpt = litgpt_configs(_wheel(LITGPT, args.litgpt, Path(tmp)))
        if args.compare_vendored:
            print("\n".join(compare_vendored(litgpt)))
            return 0
        torchtune = torchtune_builders(_wheel(TORCHTUNE, args.torchtune, Path(tmp)))
    index, files = build(litgpt, torchtune)
    committed = CATALOG / "models.json"
    index = merge(index, json.loads(committed.read_text()) if committed.is_file() else [])
    from aegis.models import catalog

    wanted = {CATALOG / "models.json": _dump(index), **{CATALOG / "models" / n: _dump(c) for n, c in files.items()}}
    wanted[CATALOG / "names.json"] = catalog.name_index(wanted[CATALOG / "models.json"])
    stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
    listed = {row["file"] for row in index}
    orphans = [p for p in (CATALOG / "models").glob("*.json") if p.name not in listed]
    if args.check:
        for p in stale + orphans:
            print(f"differs: {p.relative_to(CATALOG)}")
        return 1 if stale or orphans else 0
    for p in stale:
        p.write_text(wanted[p])
    for p in orphans:
        p.unlink()
    print(f"{len(index)} configs ({len(files)} converted, {len(index) - len(files)} vendored); "
          f"{len(stale)} files written, {len(orphans)} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
