"""What a plan reports: the request, the dataset profile, the solved tiers, risks, throughput, cost, the report.

Part of `aegis.schema` (import them from there); they live apart so that `import aegis` and an estimate do not
build these classes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from aegis.schema import (
    GPU,
    Checkpointing,
    Frozen,
    LoRAConfig,
    MemoryEstimate,
    Method,
    Optimizer,
    Precision,
    StackProfile,
    Trainer,
    TrainConfig,
)

__all__ = ["TokenStats", "DataProblem", "DatasetProfile", "PlanRequest", "ModelSummary", "Tier", "Risk", "Throughput", "Cost", "MultiGPU", "PlanReport"]


class TokenStats(Frozen):
    """Token-length distribution of a dataset sample."""

    min: int
    mean: float
    p50: int
    p95: int
    p99: int
    max: int


class DataProblem(Frozen):
    """Rows of one kind that a run skips, drops or truncates, and where they are (planning and training
    read rows through one reader, so a plan's problems are the run's)."""

    kind: Literal["corrupt", "no_format", "empty", "no_assistant", "refused", "overlong", "truncated", "no_targets"] = Field(
        description="corrupt: not a JSON object / an unparseable CSV record; no_format: lacks the detected format's "
        "fields; empty; no_assistant: no assistant turn with text; refused: the chat template raised on it; "
        "overlong: longer than seq_len with `overlong: drop`; truncated: longer than seq_len, cut to it; "
        "no_targets: no assistant token left within seq_len.")
    count: int = Field(description="How many (every row; only the tokenized sample when `sampled`).")
    lines: tuple[int, ...] = Field(description="The first of them (up to 100), as 1-based lines or row numbers (`unit`).")
    unit: Literal["line", "row"] = Field(description="line: file lines of JSON Lines / CSV; row: row numbers otherwise.")
    action: Literal["skipped", "dropped", "truncated"] = Field(description="What training does with them.")
    reason: str = Field(default="", description="Why the first of them is a problem.")
    sampled: bool = Field(default=False, description="Counted in the tokenized sample only, not in every row.")


class DatasetProfile(Frozen):
    """What a dataset looks like once rendered through the chat template and tokenized."""

    source: str = Field(description="Path or hub id as given.")
    format: Literal["alpaca", "sharegpt", "messages", "prompt_completion", "text"]
    num_rows: int = Field(description="Rows in the dataset (all of them, not only the sample).")
    sampled_rows: int = Field(description="Rows tokenized for the statistics.")
    tokenizer: str = Field(description="Which tokenizer produced the numbers.")
    tokenizer_exact: bool = Field(description="False when the tokenizer is an approximation of the model's own.")
    tokens: TokenStats
    template_overhead_tokens: float = Field(description="Mean tokens added by the chat template per row.")
    seq_len: int = Field(description="Sequence length the statistics below were computed at.")
    seq_len_reason: str = Field(description="Why this sequence length (p95 vs max, ...).")
    truncated_share: float = Field(description="Share of rows longer than seq_len.")
    padding_waste: float = Field(description="Share of padded tokens when padding every row to seq_len.")
    packing_efficiency: float = Field(description="Share of real tokens when packing rows into seq_len blocks.")
    bad_lines: tuple[int, ...] = Field(default=(), description="1-based line numbers that could not be parsed.")
    notes: tuple[str, ...] = ()
    row_lengths: tuple[int, ...] = Field(
        default=(),
        description="Tokens of each sampled row that fits the format, in file order (every row when the dataset "
        "has at most the sample size): with the model's own tokenizer, the lengths a run trains before truncation.",
    )
    rows_read: int | None = Field(default=None, description="Records in the source, the corrupt ones included.")
    problems: tuple[DataProblem, ...] = Field(
        default=(), description="Rows a run skips, drops or truncates, by kind, with their lines; `num_rows` leaves "
        "out the skipped and dropped ones.")


class PlanRequest(Frozen):
    """A planning request: from the CLI flags, Python, or parsed from free text. None = not said."""

    model: str | None = Field(default=None, description="Canonical hub id (or a path).")
    method: Method | None = None
    gpu: str | None = Field(default=None, description="Catalog GPU id.")
    gpu_count: int | None = Field(default=None, ge=1)
    dataset: str | None = Field(default=None, description="Local path or hub dataset id.")
    lora_rank: int | None = Field(default=None, ge=1)
    lora_targets: tuple[str, ...] | None = Field(
        default=None, min_length=1, description="LoRA target_modules (PEFT names, or 'all-linear'); default: attention + MLP."
    )
    micro_batch_size: int | None = Field(default=None, ge=1)
    effective_batch_size: int | None = Field(default=None, ge=1)
    seq_len: int | None = Field(default=None, ge=1)
    epochs: float | None = Field(default=None, gt=0)
    optimizer: Optimizer | None = None
    gradient_checkpointing: bool | None = None
    precision: Precision | None = None
    trainer: Trainer | None = Field(default=None, description="What runs the step (default: detected, else hf).")
    transformers_version: str | None = Field(default=None, description="transformers version the run uses (default: detected, else 5).")
    kbit_prep: bool | None = Field(default=None, description="prepare_model_for_kbit_training runs (default: the trainer's).")
    liger: bool | None = Field(default=None, description="Liger kernels on (default off).")
    checkpointing_mode: Checkpointing | None = Field(
        default=None, description="Checkpointing variant (default non_reentrant; offload with Unsloth)."
    )
    lora_dropout: float | None = Field(default=None, ge=0, lt=1, description="LoRA dropout (default 0).")
    zero_stage: int | None = Field(
        default=None, description="DeepSpeed ZeRO stage (2 or 3) the HF Trainer runs over the GPUs (default: none; "
        "the planner chooses DDP or FSDP).")
    sharding: Literal["ddp", "fsdp"] | None = Field(
        default=None, description="How the GPUs share the model: 'ddp' replicates it, 'fsdp' shards weights, gradients "
        "and optimizer states (FULL_SHARD) (default: the planner chooses the faster one that fits).")
    autocast: bool | None = Field(
        default=None, description="The step runs under torch.autocast (default: the trainer's; HF Trainer, TRL and "
        "axolotl with bf16=True / fp16=True do). False: a pure bf16 step, as a custom loop without autocast runs it.")

    def merged(self, override: "PlanRequest") -> "PlanRequest":
        """This request with every field `override` sets replacing ours (flags win over text)."""
        return self.model_copy(update=override.model_dump(exclude_none=True))


class ModelSummary(Frozen):
    """The model facts a report shows (a `ModelProfile` without its config and shapes)."""

    model_id: str
    architecture: str
    family_description: str
    total_params: int
    active_params_per_token: int
    vocab_size: int
    num_layers: int
    hidden_size: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    source: str = Field(description="catalog, path, hub or cache.")
    lora_names: tuple[str, ...] = Field(
        default=(), description="LoRA target names that select a module of this model (empty: not known)."
    )


class Tier(Frozen):
    """One solved configuration: recommended, aggressive or a fallback entry."""

    name: str = Field(description="'recommended', 'aggressive' or 'fallback N'.")
    config: TrainConfig
    memory: MemoryEstimate = Field(description="The engine's estimate for this configuration.")
    headroom_bytes: int = Field(description="Usable memory minus the predicted high end (negative: does not fit).")
    fits: bool = Field(description="Predicted high end within the usable memory.")
    summary: str = Field(description="One line: what changed and why (e.g. 'same effective batch, same quality').")
    relative_speed: float = Field(default=1.0, description="Expected throughput in relative units (higher is faster); compare tiers by ratio.")


class Risk(Frozen):
    """A sanity check's verdict."""

    level: Literal["ok", "warn", "danger"]
    title: str = Field(description="Short label, e.g. 'VRAM', 'Eval spike'.")
    detail: str = Field(description="What was found and what to do.")


class Throughput(Frozen):
    """Throughput and time estimates for the recommended tier."""

    tokens_per_s_low: float
    tokens_per_s_high: float
    source: Literal["estimated", "measured"]
    basis: str = Field(description="How: FLOPs/token over the GPU's bf16 rate at an MFU range, or the stored measurement.")
    epoch_hours_low: float
    epoch_hours_high: float
    total_hours_low: float
    total_hours_high: float


class Cost(Frozen):
    """Cost of the whole run on one provider's GPUs."""

    gpu_id: str
    provider: str
    usd_low: float
    usd_high: float
    usd_per_hour: float
    as_of: str
    counterfactual: bool = Field(default=False, description="A cloud price shown for a locally owned GPU.")


class MultiGPU(Frozen):
    """Per-GPU memory with more than one GPU, for both ways of splitting the job."""

    gpu_count: int
    ddp_bytes: int = Field(description="Per-GPU peak with plain data parallel (everything replicated).")
    fsdp_bytes: int = Field(description="Per-GPU peak fully sharded (weights, grads, optimizer states / N + gathered layer + buffers).")
    assumed: Literal["ddp", "fsdp", "deepspeed"] = Field(description="Which one the recommendation assumes "
                                                          "('deepspeed': the ZeRO stage the request asked for).")
    reason: str
    compared_at: str = Field(default="", description="The one configuration both figures are for, e.g. "
                                                     "'micro batch 1, checkpointing ON' (the recommended tier may differ).")
    efficiency_low: float = Field(description="Scaling efficiency range used for time estimates.")
    efficiency_high: float
    zero_stage: int | None = Field(default=None, description="DeepSpeed ZeRO stage (2 or 3) when assumed is 'deepspeed'.")
    zero_bytes: int | None = Field(default=None, description="Per-GPU peak under that ZeRO stage.")
    deepspeed: dict[str, Any] | None = Field(
        default=None, description="The HF Trainer's deepspeed= config the ZeRO plan was sized for (HF's documented "
        "ZeRO config with its 'auto' buckets resolved for this model).")
    parallel: dict[str, int] = Field(
        default_factory=dict,
        description="The JAX engine's mesh for this plan (`aegis run --plan`, `aegis.train.parallel`): every GPU a "
        "data rank ({data: N}) where DDP is assumed, the model sharded over them ({fsdp: N}) where FSDP is.",
    )


class PlanReport(Frozen):
    """Everything `aegis plan` found: the product. Renders as text, Markdown, JSON."""

    request: PlanRequest
    model: ModelSummary
    dataset: DatasetProfile | None = None
    gpu: GPU
    gpu_count: int = 1
    usable_bytes: int = Field(description="Per-GPU memory minus framework overhead.")
    method: Method
    lora: LoRAConfig | None = None
    trainable_params: int
    epochs: float
    num_rows: int | None = Field(default=None, description="Dataset rows (None without a dataset).")
    steps_per_epoch: int | None = None
    recommended: Tier | None = Field(default=None, description="None when nothing fits.")
    aggressive: Tier | None = None
    fallbacks: tuple[Tier, ...] = ()
    multi_gpu: MultiGPU | None = None
    throughput: Throughput | None = None
    costs: tuple[Cost, ...] = ()
    risks: tuple[Risk, ...] = ()
    notes: tuple[str, ...] = Field(default=(), description="Reasons and explanations shown with the report.")
    nothing_fits: str | None = Field(default=None, description="When nothing fits: why, and what would.")
    stack: StackProfile = Field(default_factory=StackProfile, description="The software stack the plan was sized for.")
    stack_source: dict[str, Literal["given", "detected", "default"]] = Field(
        default_factory=dict,
        description="For trainer, transformers_version, kbit_prep, liger, checkpointing: given by the user, detected "
        "from installed package metadata, or the default.",
    )
