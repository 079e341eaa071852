"""The architecture registry: one validated description per config.json ``model_type``, as data.

Each ``_data/<model_type>.json`` holds what Aegis knows about a decoder family without running it:

- ``defaults``: transformers' ``Config`` class defaults of the keys the readers use (a Hub config.json
  leaves out any key at its default);
- the sliding/global attention pattern rule, how biases, experts and sparse layers are read;
- every parameter of a decoder layer as the Hugging Face checkpoint names it (``path`` under
  ``model.layers.{i}.``, or the entry's ``layers_path``), with its shape as an expression over the config (``hidden``, ``heads``,
  ``kv_heads``, ``head_dim``, ``intermediate``, ``experts``, ``expert_width`` or any config key), whether it has a bias,
  the PEFT target names that select it, whether bitsandbytes quantises it, and when it exists;
- norm placement, soft-capping, attention sinks and the engine's layer function and checkpoint recipe.

The planner's shapes (`aegis.models.families`), the config readers (`aegis.models.architectures.config_keys`), the JAX engine's
family table and checkpoint names (`aegis.train.modeling.families`) and the JAX memory profile read it;
``tests/models/architectures/test_registry.py`` expands every entry on tiny configs and compares the names and shapes
with transformers' own ``state_dict``. Adding a family that reuses existing layer kinds is a new JSON file.

    from aegis.models.architectures import registry
    entry = registry.get("qwen3")       # pydantic model, cached
    entry.layer_params(config, i)        # [(path, shape), ...] as transformers names them

Pure Python (json + pydantic, already the SDK's); files load lazily, one per model type asked for.
"""

from __future__ import annotations

import ast
import functools
import json
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from aegis.errors import InvalidConfigError

__all__ = ["Param", "MoE", "Unsupported", "Architecture", "get", "find", "model_types", "all_entries", "evaluate", "Vars"]

_DATA = "_data"

# ----- expressions ------------------------------------------------------------------------------------------

_ALLOWED = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.USub, ast.Name,
    ast.Load, ast.Constant, ast.BoolOp, ast.And, ast.Or, ast.Not, ast.Compare, ast.Eq, ast.NotEq, ast.Gt,
    ast.GtE, ast.Lt, ast.LtE, ast.IfExp,
)


@functools.cache
def _compile(expr: str) -> Any:
    tree = ast.parse(expr, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(f"expression {expr!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
            raise ValueError(f"expression {expr!r}: only numeric constants")
    return compile(tree, f"<registry:{expr}>", "eval")


class Vars(dict):
    """Names an expression may read, computed on first use: the family's derived quantities, else any
    config key read with transformers' default (None and false read as 0)."""

    def __init__(self, entry: Architecture, config: dict[str, Any], **given: Any) -> None:
        super().__init__(given)
        self.entry = entry
        self.config = config

    def __missing__(self, name: str) -> Any:
        from aegis.models.architectures import config_keys as arch

        c = self.config
        if name in self.entry.vars:
            out = evaluate(self.entry.vars[name], self)
        elif name == "hidden":
            out = arch.required_int(c, "hidden_size")
        elif name == "heads":
            out = arch.required_int(c, "num_attention_heads")
        elif name == "kv_heads":
            out = arch.num_kv_heads(c)
        elif name == "head_dim":
            out = arch.head_dim(c)
        elif name == "intermediate":
            default = self.entry.dense_width_default
            out = arch.required_int(c, "intermediate_size") if default is None or "intermediate_size" in c else default
        elif name == "experts":
            out = arch.num_experts(c)
        elif name == "top_k":
            out = arch.experts_per_tok(c)
        elif name == "expert_width":
            out = arch.moe_intermediate_size(c)
        elif name == "shared_width":
            out = arch.shared_expert_intermediate_size(c)
        else:
            raw = arch.value(c, name)
            out = 0 if raw is None else raw
        self[name] = out
        return out


def evaluate(expr: str | bool | int, names: Vars) -> Any:
    """An expression of the registry over ``names`` (a literal bool/int is itself)."""
    if isinstance(expr, (bool, int)):
        return expr
    return eval(_compile(expr), {"__builtins__": {}}, names)  # noqa: S307 — whitelisted arithmetic only


def _check_expr(value: Any) -> Any:
    if isinstance(value, str):
        _compile(value)
    return value


# ----- the schema --------------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Param(_Model):
    """One parameter kind of a decoder layer.

    ``linear: [in, out]`` is an ``nn.Linear`` (checkpoint ``<path>.weight`` [out, in], ``<path>.bias`` [out] when
    ``bias``); ``experts: [in, out]`` a fused 3-D expert tensor ``<path>`` [experts, out, in] (transposed
    ``[experts, in, out]`` when ``transposed``; ``<path>_bias`` [experts, out] when ``bias``); ``vector`` a 1-D
    parameter ``<path>`` (norms, sinks, router biases); ``matrix: [rows, cols]`` a bare 2-D weight ``<path>``."""

    path: str
    name: str | None = None
    """The planner's and engine's short name (default: ``path`` without its ``self_attn.`` / ``mlp.`` part)."""
    linear: tuple[str | int, str | int] | None = None
    experts: tuple[str | int, str | int] | None = None
    vector: str | int | None = None
    matrix: tuple[str | int, str | int] | None = None
    bias: bool | str = False
    peft: tuple[str, ...] | None = None
    """The names a PEFT ``target_modules`` entry selects it by; default its own last name; () for none."""
    lora: bool = True
    """False where PEFT maps the name elsewhere (DeepSeek's dense MLPs: to the fused experts)."""
    quantizable: bool | None = None
    """Whether bitsandbytes replaces it (default: an nn.Linear is, expert tensors and bare weights are not)."""
    rank_factor: int = 1
    transposed: bool = False
    conv1d: bool = False
    """A ``linear`` stored as transformers' ``Conv1D`` (GPT-2): checkpoint ``<path>.weight`` is [in, out]; PEFT wraps
    it with ``fan_in_fan_out`` and bitsandbytes transposes it before quantising."""
    when: str | None = None
    unless: str | None = None

    @field_validator("linear", "experts", "vector", "matrix", "bias", "when", "unless")
    @classmethod
    def _expressions(cls, v: Any) -> Any:
        return tuple(_check_expr(x) for x in v) if isinstance(v, tuple) else _check_expr(v)

    @property
    def kind(self) -> str:
        return next(k for k in ("linear", "experts", "vector", "matrix") if getattr(self, k) is not None)

    @property
    def short_name(self) -> str:
        if self.name is not None:
            return self.name
        head, _, rest = self.path.partition(".")
        return rest if rest and head in ("self_attn", "self_attention", "attention", "attn", "mlp") else self.path

    def present(self, names: Vars) -> bool:
        if self.when is not None and not evaluate(self.when, names):
            return False
        return self.unless is None or not evaluate(self.unless, names)

    def checkpoint(self, names: Vars, prefix: str = "") -> list[tuple[str, tuple[int, ...]]]:
        """``(name, shape)`` of each tensor, as transformers 5 names them under ``prefix``."""
        p = prefix + self.path
        bias = bool(evaluate(self.bias, names))
        if self.linear is not None:
            i, o = (int(evaluate(x, names)) for x in self.linear)
            return [(f"{p}.weight", (i, o) if self.conv1d else (o, i))] + ([(f"{p}.bias", (o,))] if bias else [])
        if self.experts is not None:
            i, o = (int(evaluate(x, names)) for x in self.experts)
            e = int(names["experts"])
            return [(p, (e, i, o) if self.transposed else (e, o, i))] + ([(f"{p}_bias", (e, o))] if bias else [])
        if self.vector is not None:
            return [(p, (int(evaluate(self.vector, names)),))]
        rows, cols = (int(evaluate(x, names)) for x in self.matrix or ())
        return [(p, (rows, cols))]


class SharedExpert(_Model):
    params: tuple[Param, ...]
    gated: bool
    """A sigmoid gate scales the shared expert's output (Qwen2-MoE); DeepSeek adds it ungated."""


class MoE(_Model):
    """How a sparse layer is laid out and read."""

    experts_keys: tuple[str, ...]
    """Config keys of the routed-expert count, in the order transformers lets them win."""
    width: Literal["intermediate_size", "moe_intermediate_size"]
    sparse_layers: Literal["every", "step", "first_k_dense"]
    """Which layers route: all; those on the ``decoder_sparse_step`` grid not in ``mlp_only_layers``; those from
    ``first_k_dense_replace`` on."""
    router: Param
    router_is_linear: bool
    """Whether PEFT adapts the router (then it is a LoRA target named by ``router.peft``)."""
    experts: tuple[Param, ...]
    shared: SharedExpert | None = None
    shared_width: str | None = None
    expert_params: str = "3 * hidden * expert_width"
    router_params: str = "experts * hidden"
    act_saved_widths: int = 3
    """Tensors of one expert's width its activation saves per routed token: 3 for SwiGLU, 6 for GPT-OSS's
    clamped SwiGLU (gate_up, clamped gate, sigmoid, ``up + 1``, the gated product)."""
    v4_experts: tuple[str, str, str] | None = None
    """transformers 4.x names of one expert's gate, up and down ``nn.Linear`` (None: no 4.x layout modelled)."""
    v4_router_is_linear: bool = True
    """Whether that 4.x layout's router is an ``nn.Linear`` named ``gate`` (bitsandbytes quantises it, LoRA can
    target it); DeepSeek's 4.x routers hold a bare weight."""
    checkpoint_experts: tuple[str, str, str] | None = None
    """How Hub checkpoints store one expert's gate, up and down weights: ``<checkpoint_path>.{e}.<name>.weight``
    (None: stored fused, as in memory)."""
    checkpoint_path: str = "mlp.experts"


class Windows(_Model):
    rule: Literal["none", "uniform", "max_window_layers", "qwen2_moe", "alternate", "pattern", "no_rope_layers"]
    explicit_layer_types: bool = False
    """Whether the config honours an explicit ``layer_types`` list."""
    use_sliding_window: bool = False
    """Whether ``sliding_window`` is switched off unless ``use_sliding_window``."""
    bidirectional_halves: bool = False
    pattern: int = 6
    """``pattern`` rule: every ``pattern``-th layer is full attention (Gemma 3: 6, OLMo 3: 4)..."""
    pattern_key: str | None = "sliding_window_pattern"
    """...unless the config sets this key (Gemma 3's constructor argument); None: the pattern is fixed."""


class Unsupported(_Model):
    when: str
    """An expression over the config that is true for a config this entry cannot read."""
    why: str
    """The one-line reason (what the setting is, which checkpoints use it)."""

    @field_validator("when")
    @classmethod
    def _expression(cls, v: str) -> str:
        return _check_expr(v)


class Engine(_Model):
    spec: str
    """The JAX engine's spec builder (`aegis.train.modeling.families`)."""
    layer: str = "standard"
    recipe: Literal["identity", "experts", "gpt_oss", "phimoe", "granitemoe"] = "identity"


class Architecture(_Model):
    model_type: str
    also_model_types: tuple[str, ...] = ()
    family: str
    """The planner family's name (several model types may share one: llama and mistral)."""
    description: str
    hf_architectures: tuple[str, ...]
    mirrors: str
    """The transformers files this entry mirrors."""
    transformers_since: str
    """The first transformers release that has this model type: the earliest wheel on PyPI with
    ``transformers/models/<type>/`` and the type in ``CONFIG_MAPPING_NAMES`` (every minor release from 4.27 scanned;
    ``tests/models/architectures/test_registry.py`` checks the installed version is not older)."""
    defaults: dict[str, Any]
    post_init_defaults: dict[str, Any] = Field(default_factory=dict)
    """Defaults a transformers config sets in ``__post_init__`` for keys that are not its dataclass fields (Phi's
    ``kwargs.setdefault("partial_rotary_factor", 0.5)``), read like ``defaults``."""
    dense_width_default: int | None = None
    """``intermediate_size`` class default where it matters (DeepSeek's dense layers)."""
    vars: dict[str, str] = Field(default_factory=dict)
    """Derived quantities that differ from the generic reading (DeepSeek: ``head_dim`` is nope + rope)."""
    windows: Windows
    attention: tuple[Param, ...]
    mlp: tuple[Param, ...]
    norms: tuple[Param, ...]
    final_norm: tuple[Param, ...] = (Param(path="model.norm.weight", vector="hidden"),)
    moe: MoE | None = None
    mla: bool = False
    kv_cache_elements: str = "2 * kv_heads * head_dim"
    sdpa: bool = True
    gemma_norm: bool = False
    norm_weight_float32: bool = False
    """The RMSNorms multiply their weight in float32 and cast the product back (``(self.weight * hidden_states)
    .to(input_dtype)``: OLMo 2 and 3, GPT-OSS), not the cast input (Llama's ``self.weight * hidden_states.to(input_dtype)``):
    a trained weight's gradient keeps the float32 normalised tensor, and the output has the input's dtype."""
    layer_norm: bool = False
    norm_eps_key: str | None = "rms_norm_eps"
    """Config key of the norms' epsilon (Phi: ``layer_norm_eps``); None where the code fixes it whatever the config
    holds (``OlmoLayerNorm``'s 1e-5: ``norm_eps_default``)."""
    pre_norms: bool = True
    post_norms: bool = False
    parallel_block: bool = False
    """Attention and MLP read the same normed input and both add to the residual (Phi: one ``input_layernorm``,
    ``x + attn(ln(x)) + mlp(ln(x))``)."""
    parallel_block_key: str | None = None
    """Config key that switches the parallel block on (StableLM ``use_parallel_residual``); ``parallel_block``
    when None."""
    mlp_kind: Literal["gated", "plain"] = "gated"
    """``gated``: ``down(act(gate(x)) * up(x))``; ``plain``: the two-matrix MLP ``fc2(act(fc1(x)))`` (Phi)."""
    qk_norm: bool = False
    qk_norm_key: str | None = None
    """Config key that switches the q/k norms on (Phi's ``qk_layernorm``); ``qk_norm`` when None."""
    attention_sinks: bool = False
    attention_softcap_key: str | None = None
    logit_softcap_key: str | None = None
    logits_scaling_key: str | None = None
    """Config key of a number the logits are divided by (Granite ``logits_scaling``)."""
    logit_scale_key: str | None = None
    """Config key of a number the logits are multiplied by (Cohere ``logit_scale``)."""
    float32_layer_norm: bool = False
    """The LayerNorms have no weight or bias and normalise a float32 copy of their input, cast back to its dtype
    (``OlmoLayerNorm``: ``F.layer_norm(x.to(float32), shape, None, None, eps=1e-5).to(x.dtype)``): the float32 copy
    is what autograd saves, under autocast or not."""
    rotary_dim_key: str | None = None
    """Config key of the number of leading head dims RoPE rotates (GPT-J ``rotary_dim``): a partial rotary factor of
    ``rotary_dim / head_dim``, in place of ``partial_rotary_factor``."""
    clip_qkv_key: str | None = None
    """Config key of a bound the q, k and v projections' outputs are clamped to in place (OLMo ``clip_qkv``)."""
    manual_layer_norm: bool = False
    """The LayerNorms are written out in float32 ops rather than ``nn.LayerNorm`` (Cohere's ``CohereLayerNorm``:
    mean, the centred input computed twice, rsqrt, weight only), which changes what autograd saves, not the maths."""
    rope_on_sliding_layers_only: bool = False
    """Only the sliding-window layers rotate q and k; the global ones use no positions (Cohere 2 applies RoPE where
    its layer's window is set)."""
    rope_interleaved: bool = False
    """RoPE rotates adjacent pairs ``(x0, x1), (x2, x3), ...`` (Cohere's ``rotate_half`` with ``repeat_interleave``d
    tables), not the two halves of the head."""
    residual_dropout_key: str | None = None
    """Config key of a dropout on each sublayer's output before its residual add (Seed-OSS ``residual_dropout``):
    in training its bool mask is saved for backward."""
    residual_dropout_on: tuple[Literal["attention", "mlp"], ...] = ("attention", "mlp")
    """The sublayers whose output that dropout drops (StableLM's ``hidden_dropout``: the MLP's only)."""
    unsupported: tuple[Unsupported, ...] = ()
    """Config settings this entry does not describe: such a config is refused with the reason, never misread."""
    lm_head_bias_key: str | None = None
    lm_head_bias: bool = False
    """The LM head always has a bias (Phi); ``lm_head_bias_key`` names a config switch instead (Phi-MoE)."""
    embedding_dropout_key: str | None = None
    """Config key of a dropout on the token embeddings in training (Phi ``embd_pdrop``)."""
    parallel_mlp_norm: bool | str = False
    """In a parallel block the MLP reads its own ``post_attention_layernorm`` of the block's input (GPT-NeoX; Falcon's
    ``ln_mlp`` where its config says two norms: an expression); else the attention's normed input (Phi, StableLM)."""
    qkv_grouped: bool = False
    """A fused q/k/v projection's output rows are grouped by key/value head, ``[q_1 .. q_g; k; v]`` for each in turn
    (g query heads per key/value head: GPT-NeoX's ``query_key_value`` with g = 1, Falcon's); else ``[q; k; v]``
    (Phi-3 ``qkv_proj``)."""
    attribute_map: dict[str, str] = Field(default_factory=dict)
    """transformers' ``Config.attribute_map``: a standard key and the key this model type's config.json holds it
    under (GPT-2: ``hidden_size`` is ``n_embd``); `aegis.models.architectures.config_keys` reads either."""
    position_embedding: Param | None = None
    """A learned absolute position embedding added to the token embeddings (GPT-2's ``wpe``: ``matrix``
    [positions, hidden]); None for rotary or position-free families. Its row count is a hard limit on the sequence."""
    position_offset: int = 0
    """Rows of the position table before position 0 (OPT's ``OPTLearnedPositionalEmbedding``: 2, a fairseq legacy):
    position p reads row p + offset."""
    norm_eps_default: float | None = None
    """The norms' epsilon where the config has no key for it (OPT's ``nn.LayerNorm`` default, 1e-5)."""
    base_model_prefix: str | None = None
    """transformers' ``base_model_prefix`` where checkpoints on the Hub may leave it out (GPT-2's files, saved from
    ``GPT2Model``, name ``h.0.attn.c_attn.weight`` for ``transformer.h.0.attn.c_attn.weight``)."""
    key_aliases: dict[str, str] = Field(default_factory=dict)
    """Older config.json keys transformers still reads for a key (GPT-NeoX: ``rotary_pct`` for
    ``partial_rotary_factor``, ``rotary_emb_base`` for ``rope_theta``): read where the key itself is absent."""
    sdpa_math: str | bool = False
    """An expression: the family calls SDPA with fewer key/value heads than query heads, broadcast (Falcon-7B's
    multi-query), which no fused kernel takes: the math kernel runs and saves float32 q, expanded k and v, and the
    probabilities."""
    eager_softmax_in_compute_dtype: bool = False
    """Eager attention takes the softmax in the compute dtype (Falcon's ``F.softmax(..., dtype=hidden_states.dtype)``),
    not in float32 with a cast back."""
    linear_class: str | None = None
    """The layers' linear modules are this subclass of ``nn.Linear`` (``FalconLinear``): transformers 5's bitsandbytes
    integration replaces ``type(module) is nn.Linear`` only, so it does not quantise them."""
    layers_path: str = "model.layers"
    """transformers' module path of the decoder layers (GPT-NeoX: ``gpt_neox.layers``); a layer's parameters are
    ``<layers_path>.{i}.<path>``."""
    embedding_path: str = "model.embed_tokens"
    """transformers' module path of the input embedding (GPT-NeoX: ``gpt_neox.embed_in``)."""
    lm_head_saved_as: str = "lm_head"
    """The LM head's name in checkpoint files (GPT-NeoX: ``embed_out``, which transformers 5 reads as ``lm_head``
    and writes back as ``embed_out``)."""
    engine: Engine

    @field_validator("kv_cache_elements", "parallel_mlp_norm", "sdpa_math")
    @classmethod
    def _expression(cls, v: Any) -> Any:
        return _check_expr(v)

    @property
    def plain_mlp_names(self) -> tuple[str, str]:
        """Short names of a plain MLP's input and output projections (Phi ``fc1``/``fc2``, StarCoder2
        ``c_fc``/``c_proj``): the first and last linear of ``mlp``."""
        names = [p.short_name for p in self.mlp if p.kind == "linear"]
        return names[0], names[-1]

    @property
    def layer_norm_bias(self) -> bool:
        """Whether the layers' norms have a bias (LayerNorm families but Cohere's weight-only ones)."""
        return any(p.path.endswith(".bias") for p in self.norms)

    @property
    def fused_qkv(self) -> str | None:
        """Short name of a fused q/k/v projection (Phi-3 ``qkv_proj``, GPT-NeoX ``query_key_value``); None when q, k
        and v are separate (or MLA)."""
        return next((p.short_name for p in self.attention if p.short_name in ("qkv_proj", "query_key_value", "c_attn")), None)

    @property
    def output_projection(self) -> str:
        """Short name of the attention's output projection, the last linear of ``attention`` (``o_proj``; Phi:
        ``dense``)."""
        return [p.short_name for p in self.attention if p.kind == "linear"][-1]

    def has_qk_norm(self, config: dict[str, Any]) -> bool:
        """Whether the layers norm q and k (a fixed fact of the family, or ``qk_norm_key`` of the config)."""
        from aegis.models.architectures import config_keys as arch

        return self.qk_norm or (self.qk_norm_key is not None and bool(arch.value(config, self.qk_norm_key)))

    def is_parallel(self, config: dict[str, Any]) -> bool:
        """Whether attention and the MLP read one normed input side by side (``parallel_block`` or the config's
        ``parallel_block_key``)."""
        from aegis.models.architectures import config_keys as arch

        key = self.parallel_block_key
        return self.parallel_block or (key is not None and bool(arch.value(config, key)))

    def has_parallel_mlp_norm(self, config: dict[str, Any]) -> bool:
        """Whether a parallel block gives the MLP its own LayerNorm (`parallel_mlp_norm`, for this config)."""
        return self.is_parallel(config) and bool(evaluate(self.parallel_mlp_norm, self.names(config)))

    def runs_sdpa_math(self, config: dict[str, Any]) -> bool:
        """Whether SDPA falls back to its math kernel for this config (`sdpa_math`)."""
        return bool(evaluate(self.sdpa_math, self.names(config)))

    def check_supported(self, config: dict[str, Any]) -> None:
        """UnsupportedArchitectureError naming the first `unsupported` setting the config has."""
        v = self.names(config)
        for rule in self.unsupported:
            if evaluate(rule.when, v):
                from aegis.errors import UnsupportedArchitectureError

                raise UnsupportedArchitectureError(f"{self.model_type}: {rule.why}")

    def names(self, config: dict[str, Any], **given: Any) -> Vars:
        return Vars(self, config, **given)

    def is_sparse(self, config: dict[str, Any], layer: int) -> bool:
        from aegis.models.architectures import config_keys as arch

        return self.moe is not None and arch.is_sparse_layer(config, layer)

    def layer_param_kinds(self, config: dict[str, Any], layer: int, names: Vars | None = None) -> list[Param]:
        """The parameter kinds layer ``layer`` holds, in transformers' order of sub-modules."""
        v = names if names is not None else self.names(config)
        if self.is_sparse(config, layer):
            assert self.moe is not None
            mlp = [self.moe.router, *self.moe.experts, *(self.moe.shared.params if self.moe.shared else ())]
        else:
            mlp = list(self.mlp)
        return [p for p in (*self.attention, *mlp, *self.norms) if p.present(v)]

    def layer_params(self, config: dict[str, Any], layer: int) -> list[tuple[str, tuple[int, ...]]]:
        """Every tensor of layer ``layer`` as transformers 5 names it (``<layers_path>.{layer}.`` prefixed)."""
        v = self.names(config)
        prefix = f"{self.layers_path}.{layer}."
        return [t for p in self.layer_param_kinds(config, layer, v) for t in p.checkpoint(v, prefix)]


# ----- loading -------------------------------------------------------------------------------------------------


@functools.cache
def _files() -> dict[str, str]:
    return {
        f.name[: -len(".json")]: f.name
        for f in resources.files("aegis.models.architectures").joinpath(_DATA).iterdir()
        if f.name.endswith(".json")
    }


@functools.cache
def _load(model_type: str) -> Architecture:
    text = resources.files("aegis.models.architectures").joinpath(_DATA, _files()[model_type]).read_text()
    entry = Architecture.model_validate(json.loads(text))
    if entry.model_type != model_type:
        raise InvalidConfigError(f"registry file {model_type}.json describes {entry.model_type!r}")
    return entry


@functools.cache
def _aliases() -> dict[str, str]:
    return {alias: e.model_type for e in all_entries() for alias in e.also_model_types}


def model_types() -> list[str]:
    """Every model type the registry describes (aliases included), sorted."""
    return sorted({*_files(), *_aliases()})


def all_entries() -> list[Architecture]:
    return [_load(mt) for mt in sorted(_files())]


def find(model_type: str | None) -> Architecture | None:
    """The entry for ``model_type`` (or one of its aliases), None when the registry has none."""
    if not model_type:
        return None
    if model_type in _files():
        return _load(model_type)
    target = _aliases().get(model_type)
    return _load(target) if target else None


def get(model_type: str) -> Architecture:
    entry = find(model_type)
    if entry is None:
        from aegis.errors import UnsupportedArchitectureError

        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not in the architecture registry; supported: {', '.join(model_types())}"
        )
    return entry
