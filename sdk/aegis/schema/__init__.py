"""Typed data shared by every part of Aegis: pydantic models, frozen, extra fields forbidden.

Memory is always in bytes (``*_bytes``); formatting into GB happens at the edges
(report renderers). Choices are ``Literal`` types so JSON Schema and the CLI can list them.

    from aegis.schema import TrainConfig, LoRAConfig
    cfg = TrainConfig(method="qlora", micro_batch_size=4, seq_len=1024, lora=LoRAConfig(rank=16))
"""

from __future__ import annotations

from typing import Any, Literal

from importlib import import_module

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from aegis.recipe import recipe as _recipe

__all__ = [
    "Method",
    "Precision",
    "Optimizer",
    "Attention",
    "Framework",
    "Trainer",
    "Checkpointing",
    "Frozen",
    "StackProfile",
    "LinearModule",
    "ModelProfile",
    "LoRAConfig",
    "TrainConfig",
    "GPUPrice",
    "GPU",
    "MemoryComponent",
    "DeviceLevelMemory",
    "MemoryEstimate",
    "TokenStats",
    "DataProblem",
    "DatasetProfile",
    "PlanRequest",
    "ModelSummary",
    "Tier",
    "Risk",
    "Throughput",
    "Cost",
    "MultiGPU",
    "PlanReport",
    "ALL_LINEAR_TARGETS",
    "lora_target_names",
    "lora_selects",
    "default_lora_targets",
    "LORA_GATE_TARGETS",
]

Method = Literal["full", "lora", "qlora"]
"""Training method: every weight trainable, low-rank adapters on a bf16 base, or on an NF4 base."""

Precision = Literal["bf16", "bf16_mixed", "fp16_mixed", "fp32"]
"""``bf16``: weights, grads and optimizer states in bf16 (pure). ``bf16_mixed``/``fp16_mixed``:
fp32 master weights, autocast compute. ``fp32``: everything fp32."""

Optimizer = Literal["adamw", "adamw_8bit", "paged_adamw_8bit", "sgd", "adafactor"]
"""Optimizer whose state the engine sizes."""

Attention = Literal["eager", "sdpa", "flash"]
"""Attention implementation: eager materialises batch*heads*seq^2 scores, sdpa/flash do not."""

Framework = Literal["hf", "jax"]
"""What runs the step: HF Trainer on PyTorch (CUDA caching allocator) or Aegis' JAX engine (XLA)."""

Trainer = Literal["hf", "trl", "peft", "axolotl", "unsloth"]
"""What runs the PyTorch step: HF Trainer, TRL's SFTTrainer, a plain PEFT loop (no k-bit preparation),
axolotl (HF Trainer + `prepare_model_for_kbit_training`), or Unsloth (its own k-bit set-up, checkpointing and loss)."""

Checkpointing = Literal["non_reentrant", "reentrant", "offload"]
"""Gradient-checkpointing variant: torch.utils.checkpoint with ``use_reentrant=False`` or ``True``, or Unsloth's
offloaded checkpointing (layer inputs kept in host memory)."""

ALL_LINEAR_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _own_names(module: Any) -> tuple[str, ...]:
    return module.matched_by or (module.name,)


def lora_selects(module: Any, names: frozenset[str]) -> bool:
    """Whether LoRA adapts ``module`` (a `LinearModule` or `aegis.models.families.base.Linear`) when the target
    names are ``names`` (from `lora_target_names`)."""
    return module.lora_targetable and not names.isdisjoint(_own_names(module))


def lora_target_names(targets: tuple[str, ...] | frozenset[str], modules: Any) -> frozenset[str]:
    """The module names ``target_modules`` select, with PEFT's ``"all-linear"`` expanded to every
    module PEFT can wrap among ``modules`` (anything with ``name``, ``matched_by``, ``lora_targetable``:
    `LinearModule` or `aegis.models.families.base.Linear`); `lora_selects` says which modules they adapt."""
    names = set(targets)
    if "all-linear" in names:
        names.discard("all-linear")
        names.update(n for m in modules if m.lora_targetable for n in _own_names(m))
    return frozenset(names)


LORA_GATE_TARGETS = frozenset({"gate", "router", "shared_expert_gate"})
"""Target names of MoE routers and the shared-expert gate: the standard names leave them out, and so do defaults."""


def default_lora_targets(modules: Any) -> tuple[str, ...]:
    """Attention and MLP projections of a model under the names PEFT matches there: the standard seven
    (`ALL_LINEAR_TARGETS`) that the model has, plus its own names for what they miss (Phi-3's fused
    ``qkv_proj``/``gate_up_proj``, Mixtral's experts ``w1``/``w3``/``w2``). Routers and gates stay out."""
    names: list[str] = []
    for m in modules:  # in module order: q, k, v, o, then the MLP
        own = _own_names(m)
        if not m.lora_targetable or not LORA_GATE_TARGETS.isdisjoint(own):
            continue
        standard = [n for n in ALL_LINEAR_TARGETS if n in own]
        names += [n for n in standard or own if n not in names]
    return tuple(names)


class Frozen(BaseModel):
    """Base for every Aegis model: immutable, unknown fields rejected. Validators are built on first
    use (`defer_build`), which keeps `import aegis` fast."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class LinearModule(Frozen):
    """One kind of nn.Linear in the model, with how many times it occurs in total."""

    name: str = Field(description="Module name as PEFT targets it, e.g. 'q_proj', 'experts.gate_up_proj' or 'mlp.gate'.")
    in_features: int = Field(description="Input width.")
    out_features: int = Field(description="Output width.")
    count: int = Field(description="Occurrences across the whole model (layers x experts).")
    bias: bool = Field(default=False, description="Whether the module has a bias vector.")
    lora_targetable: bool = Field(
        default=True, description="False where PEFT cannot wrap it with a LoRA layer (Qwen2-MoE's fused 3-D experts)."
    )
    quantizable: bool = Field(default=True, description="Quantised to NF4 under QLoRA (bitsandbytes Linear4bit).")
    matched_by: tuple[str, ...] = Field(
        default=(), description="LoRA target names that select it (its own, plus q_proj etc. for fused projections)."
    )
    lora_rank_factor: int = Field(default=1, description="LoRA rank multiple PEFT uses here (2: fused gate+up experts).")


class ModelProfile(Frozen):
    """A model's architecture and parameter counts, all computed from config.json shapes."""

    model_id: str = Field(description="Canonical Hugging Face id, or the path it was read from.")
    source: Literal["catalog", "path", "hub", "cache"] = Field(description="Where the config came from.")
    architecture: str = Field(description="config.json `architectures[0]`, e.g. LlamaForCausalLM.")
    model_type: str = Field(description="config.json `model_type`.")
    family: str = Field(description="Aegis architecture family serving it ('llama', 'gemma2', 'mixtral', ...).")
    family_description: str = Field(default="", description="Kind of decoder, e.g. 'dense decoder', 'mixture of experts'.")
    num_layers: int
    hidden_size: int
    intermediate_size: int = Field(description="Dense MLP width (MoE: per-expert width).")
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    num_experts: int = Field(default=0, description="Routed experts per MoE layer; 0 for dense models.")
    num_experts_per_tok: int = Field(default=0, description="Experts each token is routed to (top-k).")
    sliding_window: int | None = Field(default=None, description="Sliding-window size where some layers use one.")
    total_params: int = Field(description="All parameters, every expert included.")
    embedding_params: int = Field(description="Input embedding matrix.")
    lm_head_params: int = Field(description="Output projection; 0 when tied to the embeddings.")
    position_embedding_params: int = Field(
        default=0, description="Learned absolute position embedding (GPT-2's wpe: positions x hidden); 0 for RoPE models."
    )
    layer_params: tuple[int, ...] = Field(description="Parameters of each decoder layer, in order.")
    norm_params: int = Field(description="All normalisation weights (layers and final norm).")
    active_params_per_token: int = Field(description="Parameters one token touches (MoE: top-k experts only).")
    linear_modules: tuple[LinearModule, ...] = Field(description="Every nn.Linear kind in the decoder stack.")
    config: dict[str, Any] = Field(description="The config.json the profile was computed from.", repr=False)
    layout_major: int = Field(
        default=5, description="transformers major whose module layout the shapes follow (4: separate MoE expert Linears)."
    )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def trainable_params(self, method: Method, lora: "LoRAConfig | None" = None) -> int:
        """Trainable parameters for a method (LoRA: adapter parameters from real module shapes)."""
        if method == "full":
            return self.total_params
        lora = lora or LoRAConfig()
        targets = lora_target_names(lora.target_modules, self.linear_modules)
        return sum(
            m.count * lora.rank * m.lora_rank_factor * (m.in_features + m.out_features)
            for m in self.linear_modules
            if lora_selects(m, targets)
        )


class LoRAConfig(Frozen):
    """Low-rank adapter settings, as PEFT's LoraConfig takes them; what is not given is the recipe's
    (:mod:`aegis.recipe`: rank 16, alpha 2 x rank, dropout 0)."""

    # factories: the recipe is read on first use, not while `import aegis` runs (validating it at import loads
    # pydantic's plugin machinery, ~30 ms of every `aegis plan`)
    rank: int = Field(default_factory=lambda: _recipe().lora.rank, ge=1, le=4096, description="Adapter rank r.")
    alpha: float = Field(
        default_factory=lambda: _recipe().lora.alpha(_recipe().lora.rank), gt=0,
        description="Scaling numerator: adapters are scaled by alpha / r (not given: the recipe's alpha_per_rank x rank).",
    )
    dropout: float = Field(default_factory=lambda: _recipe().lora.dropout, ge=0, lt=1,
                           description="Dropout on the adapter input.")
    target_modules: tuple[str, ...] = Field(default=ALL_LINEAR_TARGETS, description="Module names to wrap.")

    @model_validator(mode="before")
    @classmethod
    def _alpha_from_rank(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("alpha") is None:
            rank = data.get("rank")
            lora = _recipe().lora
            data = {**data, "alpha": lora.alpha(rank if isinstance(rank, int) and rank >= 1 else lora.rank)}
        return data

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("target_modules is empty: name at least one module, e.g. q_proj")
        return v


class StackProfile(Frozen):
    """The software stack a PyTorch run uses: what the memory engine models beyond the configuration itself.

    ``StackProfile()`` is what Aegis modelled before profiles existed: HF Trainer on transformers 5 with
    ``prepare_model_for_kbit_training`` for QLoRA and non-reentrant checkpointing."""

    trainer: Trainer = Field(default="hf", description="What runs the step: hf, trl, peft (plain loop), axolotl, unsloth.")
    transformers_version: str = Field(
        default="5",
        description="transformers version: '4', '4.48', '4.48.1', '5.23'...; only the major changes layouts today.",
    )
    kbit_prep: bool | None = Field(
        default=None,
        description="prepare_model_for_kbit_training ran (QLoRA: unquantised weights upcast to fp32); None = the trainer's default.",
    )
    liger: bool = Field(default=False, description="Liger kernels: fused linear cross-entropy, fused RMSNorm/RoPE/SwiGLU.")
    checkpointing: Checkpointing = Field(
        default="non_reentrant", description="Checkpointing variant when gradient checkpointing is on."
    )
    adamw: Literal["foreach", "fused"] | None = Field(
        default=None,
        description="torch AdamW's implementation: foreach (a state-sized temporary per tensor of a group during the "
        "step) or fused (none); None = the trainer's default: fused on transformers 5 (TrainingArguments' optim "
        "adamw_torch_fused with torch >= 2.8, and what Aegis's emitted scripts ask for), foreach on 4.x (adamw_torch).",
    )

    @field_validator("transformers_version")
    @classmethod
    def _version(cls, v: str) -> str:
        v = v.strip().removeprefix("v")
        parts = v.split(".")
        if not parts[0].isdigit() or int(parts[0]) < 4:
            raise ValueError(f"transformers version {v!r} is not one Aegis models: give 4.x or 5.x, e.g. '4.48.1' or '5'")
        return v

    @property
    def transformers_major(self) -> int:
        """The major version: 4 keeps MoE experts as separate nn.Linear modules, 5 fuses them."""
        return int(self.transformers_version.split(".")[0])

    @property
    def kbit_prep_effective(self) -> bool:
        """Whether `prepare_model_for_kbit_training` runs: as given, else the trainer's default (HF Trainer
        examples, TRL and axolotl call it; a plain PEFT loop and Unsloth do not)."""
        if self.kbit_prep is not None:
            return self.kbit_prep
        return self.trainer in ("hf", "trl", "axolotl")

    @property
    def adamw_fused(self) -> bool:
        """Whether AdamW runs fused (no foreach temporaries): as given, else transformers 5's default."""
        if self.adamw is not None:
            return self.adamw == "fused"
        return self.transformers_major >= 5

    @property
    def is_default(self) -> bool:
        """The profile Aegis modelled before stack profiles (HF Trainer, transformers 5, k-bit prep, non-reentrant)."""
        return (
            self.trainer == "hf"
            and self.transformers_major >= 5
            and self.kbit_prep_effective
            and not self.liger
            and self.checkpointing == "non_reentrant"
            and self.adamw is None
        )

    def label(self) -> str:
        """Short human label, e.g. 'TRL · transformers 4.48.1 · k-bit prep'."""
        names = {"hf": "HF Trainer", "trl": "TRL SFTTrainer", "peft": "plain PEFT loop", "axolotl": "axolotl", "unsloth": "Unsloth"}
        parts = [names[self.trainer], f"transformers {self.transformers_version}"]
        if self.liger:
            parts.append("Liger kernels")
        if self.checkpointing != "non_reentrant":
            parts.append(f"{self.checkpointing} checkpointing")
        if self.kbit_prep is not None:
            parts.append("k-bit prep" if self.kbit_prep else "no k-bit prep")
        if self.adamw is not None:
            parts.append(f"{self.adamw} AdamW")
        return " · ".join(parts)


class TrainConfig(Frozen):
    """One training configuration: what the memory engine sizes and the solver chooses."""

    method: Method = Field(default="lora", description="full, lora or qlora.")
    micro_batch_size: int = Field(default=1, description="Sequences per forward/backward pass.")
    seq_len: int = Field(default=1024, description="Tokens per sequence (padded or packed).")
    gradient_accumulation_steps: int = Field(default=1, description="Micro batches per optimizer step.")
    gradient_checkpointing: bool = Field(default=False, description="Recompute layer activations in backward.")
    remat_layers: int | None = Field(
        default=None,
        description="With gradient_checkpointing, on Aegis' JAX engine: recompute only the first this many layers; the "
        "others keep their activations (save what fits, recompute the rest). None: every layer (HF's checkpointing "
        "is always every layer). A run on a GPU picks it from the planner's memory model when left None.",
    )
    attention: Attention = Field(default="sdpa", description="Attention implementation.")
    chunked_cross_entropy: bool = Field(default=False, description="Compute the loss in vocab chunks (no full fp32 logits).")
    precision: Precision = Field(default="bf16", description="Precision mode of weights, grads and optimizer states.")
    autocast: bool | None = Field(
        default=None,
        description="Matmuls run under torch.autocast (HF Trainer's bf16=True / fp16=True: accelerate wraps the forward "
        "in it, whatever dtype the weights load in). None = the trainer's default: HF Trainer, TRL, axolotl and Unsloth "
        "(all run the Trainer) autocast in every 16-bit mode; a plain PEFT loop does not. Mixed modes always autocast.",
    )
    optimizer: Optimizer = Field(default="adamw", description="Optimizer.")
    lora: LoRAConfig | None = Field(default=None, description="Adapter settings for lora/qlora (defaults when None).")
    stack: StackProfile = Field(
        default_factory=StackProfile, description="Trainer, transformers version and kernels the run uses."
    )

    @property
    def autocast_effective(self) -> bool:
        """Whether the step runs under torch.autocast: as given, else the trainer's default. HF Trainer (and TRL,
        axolotl and Unsloth, which run it) pass ``bf16=True``/``fp16=True`` to accelerate, whose ``prepare_model``
        wraps the model's forward in ``torch.autocast`` (accelerate ``Accelerator.native_amp``) even when the weights
        load in bf16; Aegis's emitted scripts set the flag too. A plain PEFT loop and fp32 runs have no autocast."""
        if self.precision in ("bf16_mixed", "fp16_mixed"):  # fp32 (or fp16) weights: always under autocast
            return True
        if self.autocast is not None:
            return self.autocast
        return self.precision != "fp32" and self.stack.trainer != "peft"

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        for name in ("micro_batch_size", "seq_len", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.remat_layers is not None and (self.remat_layers < 0 or not self.gradient_checkpointing):
            raise ValueError(
                f"remat_layers {self.remat_layers} needs gradient_checkpointing on and a count >= 0: set "
                "gradient_checkpointing: true, or drop remat_layers"
            )
        if self.remat_layers is not None and self.method == "full":
            raise ValueError(
                "remat_layers applies to lora and qlora: full fine-tuning recomputes every layer or none (splitting the "
                "trained weights between two layer loops would copy them); drop remat_layers"
            )
        if self.method == "full" and self.lora is not None:
            raise ValueError("full fine-tuning takes no LoRA settings: drop `lora` or use method lora/qlora")
        return self

    @property
    def lora_config(self) -> LoRAConfig:
        return self.lora or LoRAConfig()

    @property
    def effective_batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps


class GPUPrice(Frozen):
    """A cloud list price for one GPU."""

    provider: str = Field(description="Cloud provider, e.g. 'runpod'.")
    usd_per_hour: float = Field(gt=0, description="On-demand price per GPU-hour in US dollars.")
    as_of: str = Field(description="Date the price was read (YYYY-MM).")


class GPU(Frozen):
    """One accelerator model from the catalog."""

    id: str = Field(description="Canonical catalog id, e.g. 'rtx-3090'.")
    name: str = Field(description="Display name, e.g. 'NVIDIA RTX 3090'.")
    aliases: tuple[str, ...] = Field(default=(), description="Other names users type.")
    vendor: Literal["nvidia", "amd"] = "nvidia"
    compute_capability: str | None = Field(
        default=None, description="CUDA compute capability, e.g. '9.0' (NVIDIA only): which fused kernels run."
    )
    memory_bytes: int = Field(gt=0, description="Total device memory.")
    bandwidth_gb_per_s: float = Field(gt=0, description="Memory bandwidth in GB/s.")
    bf16_tflops: float = Field(gt=0, description="Dense bf16 tensor throughput (no sparsity) in TFLOPS.")
    fp16_tflops: float | None = Field(
        default=None, gt=0,
        description="Dense fp16 tensor throughput in TFLOPS where it differs from bf16: cards without bf16 tensor "
        "cores (T4, V100), whose bf16 runs emulated at the fp32 rate. None: the bf16 rate.")
    overhead_bytes: int = Field(ge=0, description="CUDA context + framework reservation, unusable for tensors.")
    local: bool = Field(default=False, description="Consumer card usually owned, not rented.")
    prices: tuple[GPUPrice, ...] = Field(default=(), description="Cloud prices, cheapest first.")

    @property
    def usable_bytes(self) -> int:
        return self.memory_bytes - self.overhead_bytes

    @property
    def bf16_native(self) -> bool:
        """bf16 has tensor cores here: NVIDIA compute capability 8.0 (Ampere) or later, and AMD Instinct cards.
        Before Ampere, torch runs bf16 emulated (`torch.cuda.is_bf16_supported(including_emulation=True)`)."""
        return self.compute_capability is None or int(self.compute_capability.split(".")[0]) >= 8

    def tflops(self, precision: str) -> float:
        """Dense tensor TFLOPS the step's matmuls run at in ``precision`` (fp16 where the card is faster at it)."""
        return (self.fp16_tflops or self.bf16_tflops) if precision == "fp16_mixed" else self.bf16_tflops


class MemoryComponent(Frozen):
    """One line of the memory breakdown."""

    name: str = Field(description="Short label, e.g. 'Optimizer states (AdamW)'.")
    key: str = Field(description="Stable machine key, e.g. 'optimizer'.")
    bytes: int = Field(ge=0, description="Bytes this component holds at the peak.")
    formula: str = Field(description="How the bytes were computed, with the numbers filled in.")
    note: str = Field(default="", description="Why it is this size / what changes it.")
    in_peak: bool = Field(default=True, description="Counted in the training peak (False: shown for information).")


class DeviceLevelMemory(Frozen):
    """One GPU's memory at the step's peak at three levels (bytes; `aegis.planning.memory.runtime` says where each figure
    comes from): allocated <= reserved <= what nvidia-smi shows."""

    allocated_bytes: int = Field(description="Peak of live tensor blocks (torch.cuda.max_memory_allocated).")
    reserved_bytes: int = Field(description="Peak of the caching allocator's segments (torch.cuda.max_memory_reserved).")
    cache_bytes: int = Field(description="reserved - allocated: freed and split blocks the allocator keeps cached.")
    context_bytes: int = Field(description="The CUDA context (a published measurement: aegis.planning.memory.runtime).")
    cublas_workspace_bytes: int = Field(description="PyTorch's cuBLAS workspace of the training stream.")
    nccl_bytes: int = Field(description="NCCL's communication buffers (0 on one GPU).")
    device_bytes: int = Field(description="What nvidia-smi shows for the process: reserved + context + cuBLAS + NCCL.")
    replay: str = Field(description="The allocation stream the reserved figure replayed, e.g. 'two steps of 2048 "
                                    "tokens' or '16 steps of the dataset's lengths, then one of 2048 tokens'.")


class MemoryEstimate(Frozen):
    """Predicted peak memory of one training configuration on one GPU."""

    model_id: str
    config: TrainConfig
    framework: Framework = "hf"
    components: tuple[MemoryComponent, ...]
    tensor_bytes: int = Field(description="Peak of live tensor bytes (what the truth harness traces).")
    overhead_bytes: int = Field(description="CUDA context, workspaces and allocator reserve added on top.")
    dynamic_margin_bytes: int = Field(description="+/- fragmentation and transient peaks.")
    total_bytes: int = Field(description="tensor_bytes + overhead_bytes: the expected device peak.")
    low_bytes: int = Field(description="total_bytes - dynamic margin.")
    high_bytes: int = Field(description="total_bytes + dynamic margin.")
    eval_peak_bytes: int = Field(description="Peak of an eval step at the eval length (KV/logits spike).")
    peak_phase: str = Field(default="", description="Moment of the step that holds the peak.")
    reserved_bytes: int | None = Field(
        default=None,
        description=(
            "Predicted torch.cuda.max_memory_reserved: the CUDA caching allocator model replaying this step's "
            "allocation stream (aegis.planning.memory.device); None where not computed (the planner computes it for the "
            "tiers it reports)."
        ),
    )
    expandable_segments: bool = Field(
        default=False, description="reserved_bytes assumes PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
    )
    device_level: DeviceLevelMemory | None = Field(
        default=None, description="Allocated, reserved and device-level (nvidia-smi) memory at the peak, where the "
        "allocator was replayed (aegis.planning.memory.device); None elsewhere.")
    notes: tuple[str, ...] = ()
    stack_notes: tuple[str, ...] = Field(
        default=(), description="What the configuration's stack profile changed in this estimate, one line each."
    )

    @property
    def device_bytes(self) -> int | None:
        """What the device shows at the peak: reserved segments plus the CUDA context and workspaces."""
        return None if self.reserved_bytes is None else self.reserved_bytes + self.overhead_bytes

    def component(self, key: str) -> MemoryComponent:
        for c in self.components:
            if c.key == key:
                return c
        raise KeyError(f"no component {key!r}; have {[c.key for c in self.components]}")


_REPORT = frozenset({"TokenStats", "DataProblem", "DatasetProfile", "PlanRequest", "ModelSummary", "Tier", "Risk", "Throughput", "Cost", "MultiGPU", "PlanReport"})
"""What a plan reports (`aegis.schema.report`): built on first use, so `import aegis` and an estimate skip them."""


def __getattr__(name: str) -> Any:
    if name not in _REPORT:
        raise AttributeError(f"module 'aegis.schema' has no attribute {name!r}")
    value = getattr(import_module("aegis.schema.report"), name)
    globals()[name] = value
    return value
