"""Merge models as mergekit does: a merge YAML in, a Hugging Face model folder out, tensor by tensor.

    result = merge_models("merge.yml", "merged/")      # MergeResult: layers, tensors, shards, warnings
    result = merge_models(cfg, "merged/", seed=0, max_shard_bytes=2**30, on_tensor=print)
    AutoModelForCausalLM.from_pretrained("merged/")    # config.json, shards (+ index), tokenizer files

The whole merge is planned before anything is written: every model located, every output tensor's
inputs, parameters, dtype and shape worked out from the safetensors headers. Bad input (an unknown key
or parameter, a missing tensor, shapes or architectures that differ, a layer range past the end) is an
:class:`~aegis.errors.InvalidConfigError` naming the key, model or tensor, raised before the output
folder is touched. Then tensors are read, merged and streamed to the shards one at a time.

How mergekit lays a merge out, reproduced here (``mergekit/plan.py``):

* ``models:`` is one slice over all layers of every model (the base is added when it is not listed);
  ``slices:`` are output layer blocks, each merged from equally long layer ranges of its sources.
* A parameter gradient runs over each slice's layers (``t = i / (n - 1)``); tensors outside the layer
  stack use ``t = 0``: embeddings are merged from the first slice's sources, the final norm and the head
  from the last slice's.
* The output's config is the base model's (else the first model's) with the new depth, ``dtype``, and
  per-layer lists such as ``layer_types`` rebuilt from the layers taken; without ``tokenizer_source`` the
  tokenizer is copied from the base (else the first model) and rows are merged by index.
* With ``tokenizer_source`` (``base``, ``union`` or a model) the output tokenizer is built as mergekit builds
  it and the embedding and head rows are merged by token: each model gives, for each output token, its own row
  for that token, or mergekit's default row where it lacks it (``aegis.forge._vocab``); ``vocab_size`` becomes
  the output tokenizer's length.

Layers are found from the tensor names (``<prefix>.<index>.<rest>``, the way mergekit infers an
architecture); a tensor outside the stack is an embedding (merged with the first slice) when its name
says so (``embed_tokens``, ``wte``, ...), else a head-side tensor (merged with the last slice).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from aegis.errors import AegisError, InvalidConfigError
from aegis.forge.merge_config import MergeConfig, load_merge_config, resolve
from aegis.schema import Frozen
from aegis.models.architectures.config_keys import tie_word_embeddings
from aegis.train.safetensors_io import FLOATING, MAX_SHARD_BYTES, code_of

__all__ = ["MergeResult", "merge_models", "MAX_SHARD_BYTES"]

_LAYER = re.compile(r"\.(\d+)\.")
_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|embed_in|wte|wpe|word_embeddings|position_embeddings|tok_embeddings)(\.|$)")
_INPUT_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|embed_in|wte|word_embeddings|tok_embeddings)\.weight$")
_HEAD = re.compile(r"(^|\.)(lm_head|embed_out)\.")
_VOCAB_TENSOR = re.compile(r"((^|\.)(embed_tokens|embed_in|wte|word_embeddings|tok_embeddings|lm_head|embed_out)\.weight$)")
_DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_PER_LAYER_KEYS = ("layer_types",)


class MergeResult(Frozen):
    """What a merge wrote."""

    out: Path = Field(description="The merged model folder.")
    merge_method: str = Field(description="The mergekit method used.")
    num_layers: int = Field(description="Layers of the merged model.")
    tensors: int = Field(description="Tensors written.")
    shards: tuple[str, ...] = Field(description="Safetensors files written (with an index when more than one).")
    total_bytes: int = Field(description="Bytes of tensor data written.")
    seed: int | None = Field(default=None, description="Seed of DARE's random masks (None: fresh entropy).")
    warnings: tuple[str, ...] = Field(default=(), description="Settings the merge ignored, one line each.")


# ----- plan ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    key: str
    start: int
    end: int
    params: Mapping[str, Any] | None
    where: str


@dataclass(frozen=True)
class _Slice:
    sources: tuple[_Source, ...]
    base: str | None
    params: Mapping[str, Any] | None
    where: str

    @property
    def length(self) -> int:
        return self.sources[0].end - self.sources[0].start


@dataclass(frozen=True)
class _Job:
    name: str
    inputs: tuple[tuple[str, str], ...]
    base_index: int | None
    shared: dict[str, Any]
    per_input: tuple[dict[str, Any], ...]
    read_code: str | None
    out_code: str
    shape: tuple[int, ...]
    floating: bool
    remap: bool = False
    vocab_base: str | None = None


@dataclass
class _Layout:
    prefix: str | None
    layers: dict[int, list[str]] = field(default_factory=dict)
    loose: list[str] = field(default_factory=list)


def _layout(names: list[str], label: str) -> _Layout:
    """Split tensor names into the layer stack (``<prefix>.<i>.<rest>`` -> rests by i) and the rest."""
    stacks: dict[str, dict[int, list[str]]] = {}
    loose: list[str] = []
    for name in names:
        m = _LAYER.search(name)
        if m is None:
            loose.append(name)
            continue
        stacks.setdefault(name[: m.start()], {}).setdefault(int(m.group(1)), []).append(name[m.end():])
    if len(stacks) > 1:
        raise InvalidConfigError(
            f"{label} has several layer stacks ({', '.join(sorted(stacks))}); only models with one stack of layers can be merged"
        )
    if not stacks:
        return _Layout(prefix=None, loose=loose)
    prefix, layers = next(iter(stacks.items()))
    return _Layout(prefix=prefix, layers=dict(sorted(layers.items())), loose=loose)


class _Planner:
    def __init__(self, cfg: MergeConfig, root: Path | None):
        from aegis.forge._methods import get_method

        self.cfg = cfg
        self.root = root
        self.method = get_method(cfg.merge_method)
        self.warnings: list[str] = []
        self.sources: dict[str, Any] = {}  # key -> ModelSource
        self.key_of: dict[str, str] = {}  # YAML spelling -> key
        self.label: dict[str, str] = {}  # key -> YAML spelling
        self.weights: dict[str, Any] = {}  # key -> ModelWeights
        self.layouts: dict[str, _Layout] = {}
        self._adapters: dict[Any, Any] = {}
        self.vocab: Any = None  # aegis.forge._vocab.OutputVocab when tokenizer_source is set
        self.vocab_sizes: dict[str, int] = {}

    # -- models

    def locate(self, spec: str, where: str) -> str:
        from aegis.models.source import locate_model

        if spec in self.key_of:
            return self.key_of[spec]
        path = Path(spec).expanduser()
        if self.root is not None and not path.is_absolute() and not path.exists() and (self.root / path).exists():
            spec_path = str(self.root / path)
        else:
            spec_path = spec
        try:
            source = locate_model(spec_path)
        except AegisError as err:
            raise InvalidConfigError(f"{where}: {err}") from None
        key = str(source.folder)
        self.key_of[spec] = key
        self.label.setdefault(key, spec)
        self.sources.setdefault(key, source)
        return key

    def open(self, key: str) -> None:
        from aegis.train.safetensors_io import ModelWeights

        if key not in self.weights:
            self.weights[key] = ModelWeights(self.label[key], self.sources[key])
            self.layouts[key] = _layout(self.weights[key].names, self.label[key])

    def depth(self, key: str) -> int:
        return len(self.layouts[key].layers)

    # -- slices

    def slices(self) -> list[_Slice]:
        cfg = self.cfg
        base = self.locate(cfg.base_model, "base_model") if cfg.base_model else None
        if base is not None:
            self.open(base)
        out: list[_Slice] = []
        if cfg.models:
            keys = [self.locate(m.model, f"models[{i}].model") for i, m in enumerate(cfg.models)]
            for k in keys:
                self.open(k)
            sources = [
                _Source(k, 0, self.depth(k), m.parameters, f"models[{i}]")
                for i, (k, m) in enumerate(zip(keys, cfg.models, strict=True))
            ]
            if base is not None and base not in keys:
                sources.append(_Source(base, 0, self.depth(base), None, "base_model"))
            depths = {self.label[s.key]: s.end for s in sources}
            if len(set(depths.values())) > 1:
                listed = ", ".join(f"{k}: {v}" for k, v in depths.items())
                raise InvalidConfigError(
                    f"models: the models have different numbers of layers ({listed}); pick equal layer ranges with `slices:`"
                )
            out.append(_Slice(tuple(sources), base, None, "models"))
        else:
            for i, s in enumerate(cfg.slices or []):
                srcs = []
                for j, src in enumerate(s.sources):
                    where = f"slices[{i}].sources[{j}]"
                    key = self.locate(src.model, f"{where}.model")
                    self.open(key)
                    start, end = src.layer_range
                    if end > self.depth(key):
                        raise InvalidConfigError(
                            f"{where}.layer_range: [{start}, {end}] is past the end of {src.model}, "
                            f"which has {self.depth(key)} layers"
                        )
                    srcs.append(_Source(key, start, end, src.parameters, where))
                lengths = {s2.end - s2.start for s2 in srcs}
                if len(lengths) > 1:
                    raise InvalidConfigError(
                        f"slices[{i}]: all sources of a slice must span the same number of layers "
                        f"(got {', '.join(str(s2.end - s2.start) for s2 in srcs)})"
                    )
                slice_base = self.locate(s.base_model, f"slices[{i}].base_model") if s.base_model else base
                out.append(_Slice(tuple(srcs), slice_base, s.parameters, f"slices[{i}]"))
        for sl in out:
            self._check_contract(sl)
        self._check_architectures(out)
        return out

    def _check_contract(self, sl: _Slice) -> None:
        m = self.method
        keys = [s.key for s in sl.sources]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup is not None:
            raise InvalidConfigError(f"{sl.where}: model {self.label[dup]} is listed twice")
        n = len(keys)
        too_many = m.max_inputs is not None and n > m.max_inputs
        if too_many or n < m.min_inputs:
            bound = m.max_inputs if too_many else m.min_inputs
            word = "exactly" if m.min_inputs == m.max_inputs else "at most" if too_many else "at least"
            base_note = " (the base included)" if m.base == "required" else ""
            raise InvalidConfigError(
                f"{sl.where}: {m.name} merges {word} {bound} model{'s' if bound != 1 else ''}{base_note}, got {n}"
            )
        if m.base == "required":
            if sl.base is None:
                raise InvalidConfigError(f"base_model: {m.name} needs a base_model")
            if sl.base not in keys:
                raise InvalidConfigError(f"{sl.where}: base_model {self.label[sl.base]} is not among its sources")

    def _check_architectures(self, slices: list[_Slice]) -> None:
        seen: dict[tuple[str, ...], str] = {}
        for key in self.weights:
            conf = self.weights[key].config
            arch = tuple(conf.get("architectures") or [str(conf.get("model_type"))])
            seen.setdefault(arch, self.label[key])
            if self.layouts[key].prefix != self.layouts[slices[0].sources[0].key].prefix:
                raise InvalidConfigError(
                    f"{self.label[key]} names its layers {self.layouts[key].prefix!r}, "
                    f"{self.label[slices[0].sources[0].key]} {self.layouts[slices[0].sources[0].key].prefix!r}: "
                    "merge models of one architecture"
                )
        if len(seen) > 1:
            listed = ", ".join(f"{label} is {'/'.join(arch)}" for arch, label in seen.items())
            raise InvalidConfigError(f"the models mix architectures ({listed}); merge models of one architecture")

    # -- parameters

    def _validator(self, kind: Any) -> Callable[[Any], Any]:
        from pydantic import TypeAdapter

        if kind not in self._adapters:
            self._adapters[kind] = TypeAdapter(kind).validate_python
        return self._adapters[kind]

    def check_parameter_names(self) -> None:
        import difflib

        from aegis.forge._methods import KNOWN_PARAMETERS

        cfg, m = self.cfg, self.method
        scopes: list[tuple[str, Mapping[str, Any] | None, bool]] = [("parameters", cfg.parameters, False)]
        scopes += [(f"models[{i}].parameters", x.parameters, True) for i, x in enumerate(cfg.models or [])]
        for i, s in enumerate(cfg.slices or []):
            scopes.append((f"slices[{i}].parameters", s.parameters, False))
            scopes += [(f"slices[{i}].sources[{j}].parameters", src.parameters, True) for j, src in enumerate(s.sources)]
        for where, params, per_model in scopes:
            for name in params or {}:
                p = m.param(name)
                if p is None and name not in KNOWN_PARAMETERS:
                    close = difflib.get_close_matches(name, list(KNOWN_PARAMETERS), n=1)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    raise InvalidConfigError(
                        f"{where}: unknown parameter {name!r}; {hint}{m.name} takes {', '.join(m.param_names)}"
                    )
                if p is None:
                    self.warnings.append(f"{where}.{name} is not a parameter of {m.name}; ignored")
                elif per_model and p.scope == "shared":
                    self.warnings.append(
                        f"{where}.{name} is one value per tensor, not per model; set it under `parameters:` (ignored here)"
                    )

    def _input_name(self, key: str, name: str, where: str) -> str:
        w = self.weights[key]
        if name in w:
            return name
        if name.endswith("lm_head.weight") and tie_word_embeddings(w.config):  # transformers' per-type default
            tied = next((n for n in self.layouts[key].loose if _INPUT_EMBEDDING.search(n)), None)
            if tied is not None:
                return tied
        raise InvalidConfigError(
            f"tensor {name} is missing from {self.label[key]} ({where}); the models must share one architecture"
        )

    def job(self, out_name: str, sl: _Slice, names: list[str], t: float) -> _Job:
        cfg, m = self.cfg, self.method
        inputs = tuple((s.key, self._input_name(s.key, n, s.where)) for s, n in zip(sl.sources, names, strict=True))
        shapes = [self.weights[k].shape(n) for k, n in inputs]
        remap = self._remapped(out_name, inputs, shapes)
        if remap:
            shapes = [(self.vocab.size, *sh[1:]) for sh in shapes]
        if len(set(shapes)) > 1:
            listed = ", ".join(f"{self.label[k]}: {list(sh)}" for (k, _), sh in zip(inputs, shapes, strict=True))
            vocab = _EMBEDDING.search(out_name) or "lm_head" in out_name
            hint = "; the vocabularies differ (aegis merges models that share one vocabulary)" if vocab else ""
            raise InvalidConfigError(f"tensor {out_name}: shapes differ ({listed}){hint}")
        codes = [self.weights[k].dtype(n) for k, n in inputs]
        floating = all(c in FLOATING for c in codes)
        read_code = code_of(cfg.dtype) if cfg.dtype and floating else None
        if not floating:
            if len(set(codes)) > 1:
                raise InvalidConfigError(f"tensor {out_name}: non-floating tensor stored as {', '.join(codes)} across models")
            if remap:
                raise InvalidConfigError(f"tensor {out_name}: a non-floating tensor cannot be remapped to tokenizer_source's vocabulary")
            return _Job(out_name, inputs, None, {}, tuple({} for _ in inputs), None, codes[0], shapes[0], False)
        eff = {read_code} if read_code else set(codes)
        promoted = eff.pop() if len(eff) == 1 else ("F64" if "F64" in eff else "F32")
        out_code = code_of(cfg.out_dtype) if cfg.out_dtype else promoted
        base_index = next(i for i, s in enumerate(sl.sources) if s.key == sl.base) if m.base == "required" else None

        shared = {
            p.name: resolve(p.name, [sl.params, cfg.parameters], tensor_name=out_name, t=t, default=p.default,
                            required=p.required, validate=self._validator(p.kind), who=f"tensor {out_name}")
            for p in m.params if p.scope == "shared"
        }
        per_input = []
        for s, (key, in_name) in zip(sl.sources, inputs, strict=True):
            values = {}
            for p in m.params:
                if p.scope == "shared" or (p.scope == "non_base" and key == sl.base):
                    continue
                values[p.name] = resolve(
                    p.name, [s.params, sl.params, cfg.parameters], tensor_name=in_name, t=t, default=p.default,
                    required=p.required, validate=self._validator(p.kind), who=f"{self.label[key]} ({s.where}), tensor {in_name}",
                )
            per_input.append(values)
        return _Job(out_name, inputs, base_index, shared, tuple(per_input), read_code, out_code, shapes[0], True,
                    remap=remap, vocab_base=sl.base)

    # -- vocabulary (tokenizer_source)

    def _vocab_size(self, key: str) -> int:
        conf = self.weights[key].config
        text = conf.get("text_config") if isinstance(conf.get("text_config"), dict) else {}
        size = conf.get("vocab_size", text.get("vocab_size"))
        if isinstance(size, int) and size > 0:
            return size
        emb = next((n for n in self.layouts[key].loose if _INPUT_EMBEDDING.search(n)), None)
        if emb is None:
            raise InvalidConfigError(f"tokenizer_source: {self.label[key]} has no vocab_size in its config.json and no embedding tensor")
        return self.weights[key].shape(emb)[0]

    def build_vocab(self) -> None:
        from aegis.forge._vocab import build_vocab

        cfg = self.cfg
        keys = list(self.weights)
        self.vocab_sizes = {k: self._vocab_size(k) for k in keys}
        source = cfg.tokenizer_source
        source_key = None
        if source not in ("base", "union"):
            source_key = self.locate(source, "tokenizer_source")
        base_key = self.key_of[cfg.base_model] if cfg.base_model else None
        folders = {k: self.sources[k].folder for k in self.sources}
        self.vocab, warnings = build_vocab(
            source, base_key, keys, folders, self.vocab_sizes, self.label, source_key=source_key
        )
        self.warnings += warnings

    def _remapped(self, out_name: str, inputs: tuple[tuple[str, str], ...], shapes: list[tuple[int, ...]]) -> bool:
        if self.vocab is None or self.vocab.identity:
            return False
        indexed = [bool(sh) and sh[0] == self.vocab_sizes[k] for (k, _), sh in zip(inputs, shapes, strict=True)]
        if _VOCAB_TENSOR.search(out_name):
            if not all(sh and sh[0] >= self.vocab_sizes[k] for (k, _), sh in zip(inputs, shapes, strict=True)):
                listed = ", ".join(
                    f"{self.label[k]}: {sh[0] if sh else 0} rows, vocab_size {self.vocab_sizes[k]}"
                    for (k, _), sh in zip(inputs, shapes, strict=True)
                )
                raise InvalidConfigError(
                    f"tensor {out_name} has fewer rows than vocab_size ({listed}); fix vocab_size in config.json"
                )
            return True  # rows past vocab_size (padding) are dropped, as mergekit does
        if (_EMBEDDING.search(out_name) or _HEAD.search(out_name)) and any(indexed):
            raise InvalidConfigError(
                f"tensor {out_name} is indexed by token and aegis remaps only embeddings and head weights to "
                "tokenizer_source's vocabulary; drop tokenizer_source or merge models that share one vocabulary"
            )
        return False

    # -- the plan

    def plan(self) -> tuple[list[_Slice], list[_Job]]:
        slices = self.slices()
        self.check_parameter_names()
        if self.cfg.tokenizer_source:
            self.build_vocab()
        first, last = slices[0], slices[-1]
        self.ref = self.key_of[self.cfg.base_model] if self.cfg.base_model else first.sources[0].key
        prefix = self.layouts[self.ref].prefix

        def loose(sl: _Slice) -> list[str]:  # every source's, the reference model's first
            keys = sorted((s.key for s in sl.sources), key=lambda k: k != self.ref)
            return list(dict.fromkeys(n for k in keys for n in self.layouts[k].loose))

        jobs = [self.job(n, first, [n] * len(first.sources), 0.0) for n in loose(first) if _EMBEDDING.search(n)]
        out_layer = 0
        for sl in slices:
            n = sl.length
            for idx in range(n):
                t = idx / (n - 1) if n > 1 else 1.0
                rests = dict.fromkeys(r for s in sl.sources for r in self.layouts[s.key].layers.get(s.start + idx, []))
                for rest in rests:
                    names = [f"{prefix}.{s.start + idx}.{rest}" for s in sl.sources]
                    jobs.append(self.job(f"{prefix}.{out_layer}.{rest}", sl, names, t))
                out_layer += 1
        jobs += [self.job(n, last, [n] * len(last.sources), 0.0) for n in loose(last) if not _EMBEDDING.search(n)]
        self.num_layers = out_layer
        return slices, jobs

    def close(self) -> None:
        for w in self.weights.values():
            w.close()


# ----- execute ---------------------------------------------------------------------------------------------


def _run_job(job: _Job, planner: _Planner, rng: Any) -> Any:
    import numpy as np

    from aegis.train.safetensors_io import DTYPES

    arrays = [planner.weights[k].read(n) for k, n in job.inputs]
    if not job.floating:
        if any(not np.array_equal(a, arrays[0]) for a in arrays[1:]):
            raise InvalidConfigError(f"tensor {job.name}: non-floating buffer differs between models")
        return arrays[0]
    target = DTYPES[job.read_code] if job.read_code else None
    if target is None and len({a.dtype for a in arrays}) > 1:
        target = np.dtype(np.float64) if any(a.dtype == np.float64 for a in arrays) else np.dtype(np.float32)
    if target is not None:
        arrays = [a.astype(target, copy=False) for a in arrays]
    if job.remap:
        from aegis.forge._vocab import remap_rows

        arrays = remap_rows(arrays, [k for k, _ in job.inputs], planner.vocab.rows, job.vocab_base)
    out = planner.method.kernel(arrays, job.base_index, job.shared, job.per_input, rng)
    return np.asarray(out).astype(DTYPES[job.out_code], copy=False)


def _out_config(planner: _Planner, slices: list[_Slice]) -> dict[str, Any]:
    cfg = planner.cfg
    conf = json.loads(json.dumps(planner.weights[planner.ref].config))
    text = conf.get("text_config") if isinstance(conf.get("text_config"), dict) else None
    holder = next((c for c in (conf, text) if c is not None and any(k in c for k in _DEPTH_KEYS)), None)
    if holder is not None:
        for key in _DEPTH_KEYS:  # every spelling present (a Cognate config.json has num_layers and num_hidden_layers)
            if key in holder:
                holder[key] = planner.num_layers
        for key in _PER_LAYER_KEYS:
            if isinstance(holder.get(key), list):
                rebuilt = []
                for sl in slices:
                    src = planner.weights[sl.sources[0].key].config
                    src = src.get("text_config", src) if holder is text else src
                    values = src.get(key)
                    if not isinstance(values, list) or len(values) < sl.sources[0].end:
                        rebuilt = None
                        break
                    rebuilt += values[sl.sources[0].start : sl.sources[0].end]
                if rebuilt is not None:
                    holder[key] = rebuilt
    if planner.vocab is not None:  # mergekit's _update_config_vocab
        vocab_holder = conf if "vocab_size" in conf or text is None else text
        vocab_holder["vocab_size"] = planner.vocab.size
    dtype = cfg.out_dtype or cfg.dtype
    if dtype:
        conf["dtype"] = dtype
        if "torch_dtype" in conf:
            conf["torch_dtype"] = dtype
    return conf


def merge_models(
    config: MergeConfig | Mapping[str, Any] | str | Path,
    out: str | Path,
    *,
    seed: int | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    overwrite: bool = False,
    on_tensor: Callable[[int, int, str], None] | None = None,
) -> MergeResult:
    """Merge the models of ``config`` (a mergekit YAML path, a mapping or a MergeConfig) into folder ``out``.

    ``seed`` fixes DARE's random masks; ``on_tensor(done, total, name)`` is called after each tensor.
    Raises InvalidConfigError (one line, naming the key, model or tensor) before writing anything, and
    OutputPathError for an ``out`` holding files Aegis did not write (unless ``overwrite``: files of the same
    name are replaced, the others kept) or one that cannot be created. ``out`` appears whole or not at all.
    """
    import numpy as np

    from aegis._outdir import check_output_dir, output_dir
    from aegis.models.source import TOKENIZER_FILES
    from aegis.train.safetensors_io import ShardWriter

    root: Path | None = None
    source_text: str | None = None
    if isinstance(config, MergeConfig):
        cfg = config
    elif isinstance(config, Mapping):
        cfg = load_merge_config(config)
    else:
        path = Path(config)
        cfg = load_merge_config(path)
        root = path.resolve().parent
        source_text = path.read_text(encoding="utf-8")
    if max_shard_bytes <= 0:
        raise InvalidConfigError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    method_name, dfs_warnings = cfg.merge_method, []
    if cfg.merge_method == "dfs":  # a layer path with scaling, written as the passthrough it compiles to
        from aegis.forge.dfs import compile_dfs

        cfg, dfs_warnings = compile_dfs(cfg, root)
    out = Path(out).expanduser()
    check_output_dir(out, overwrite=overwrite)

    planner = _Planner(cfg, root)
    try:
        slices, jobs = planner.plan()
        resolved_out = out.resolve()
        if any(resolved_out == Path(k) for k in planner.sources):
            raise InvalidConfigError(f"output folder {out} is one of the input models; choose another folder")
        if planner.vocab is None:
            planner.warnings += _vocabulary_warning(planner)

        rng = np.random.default_rng(seed)
        with output_dir(out, overwrite=overwrite, writer="aegis merge") as tmp:
            with ShardWriter(tmp, [(j.name, j.out_code, j.shape) for j in jobs], max_shard_bytes) as writer:
                for done, job in enumerate(jobs, 1):
                    writer.write(job.name, _run_job(job, planner, rng))
                    if on_tensor is not None:
                        on_tensor(done, len(jobs), job.name)
                shards = writer.finish()
            conf = _out_config(planner, slices)
            (tmp / "config.json").write_text(json.dumps(conf, indent=2) + "\n", encoding="utf-8")
            donor = planner.sources[planner.ref].folder
            if planner.vocab is not None:  # as mergekit: the built tokenizer, saved by transformers
                planner.vocab.tokenizer.save_pretrained(str(tmp))
            else:
                for name in TOKENIZER_FILES:
                    if (donor / name).is_file():
                        shutil.copy2(donor / name, tmp / name)
            if (donor / "generation_config.json").is_file():
                shutil.copy2(donor / "generation_config.json", tmp / "generation_config.json")
            (tmp / "mergekit_config.yml").write_text(source_text or _to_yaml(cfg), encoding="utf-8")
        return MergeResult(
            out=out, merge_method=method_name, num_layers=planner.num_layers, tensors=len(jobs),
            shards=tuple(shards), total_bytes=writer.total_bytes, seed=seed, warnings=(*dfs_warnings, *planner.warnings),
        )
    finally:
        planner.close()


def _vocabulary_warning(planner: _Planner) -> list[str]:
    """One line when the models' tokenizer.json vocabularies differ and rows are merged by index (as mergekit does)."""
    seen: dict[Any, str] = {}
    for key in planner.weights:
        path = planner.sources[key].folder / "tokenizer.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            vocab = dict((data.get("model") or {}).get("vocab") or {})
            vocab.update({t["content"]: t["id"] for t in data.get("added_tokens") or []})
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue  # no tokenizer.json (or not a mapping vocabulary): nothing to compare
        seen.setdefault(frozenset(vocab.items()), planner.label[key])
    if len(seen) < 2:
        return []
    return [
        f"the models' vocabularies differ ({', '.join(seen.values())}) and no tokenizer_source is set: embedding and "
        "head rows are merged by index, as mergekit does; set tokenizer_source (base, union or a model) to merge them by token"
    ]


def _to_yaml(cfg: MergeConfig) -> str:
    import yaml

    def plain(v: Any) -> Any:
        if isinstance(v, Frozen):
            return {k: plain(x) for k, x in v.model_dump(exclude_none=True).items()}
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items() if x is not None}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    return yaml.safe_dump(plain(cfg), sort_keys=False)
