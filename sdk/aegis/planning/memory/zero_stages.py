"""DeepSpeed ZeRO-2 and ZeRO-3 on rank 0, by mechanism: what each rank holds, and when.

`aegis.planning.memory.estimate.estimate` calls `zero_plan` when ``zero_stage`` is 2 or 3 and puts its terms into the
moments of the step (start of backward, each layer's backward, the optimizer step):

    plan = zero_plan(profile, cfg, place, layers, world_size=8, stage=3)
    plan.terms_at_loss(), plan.terms_in_backward(i), plan.terms_at_step()

The run is the HF Trainer under ``--deepspeed`` with ``bf16=True`` (accelerate leaves mixed precision to DeepSpeed:
no autocast) and HF's documented ZeRO configs, whose "auto" buckets the Trainer resolves from the hidden size
(`ZeroBuckets.for_hidden`). The engine casts the whole module to bf16 (``DeepSpeedEngine._configure_distributed_model``:
``self.module.bfloat16()``), LoRA adapters included; the ZeRO optimizer keeps the fp32 master copy. Each mechanism
below names the DeepSpeed 0.19 source it follows (``deepspeed/runtime/zero/``). Checked against rank 0 of traced
steps (tools/truth/zero.py, tests/data/zero_truth.json), with and without the Trainer's gradient checkpointing
(non-reentrant): the activations are then the one-GPU model's checkpointed ones, and `_inputs_require_grad` says what
checkpointing changes here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aegis.models.families import get_family
from aegis.schema import ModelProfile, TrainConfig, lora_selects, lora_target_names

__all__ = ["ZERO_STAGES", "ZeroBuckets", "ZeroPlan", "hf_deepspeed_config", "zero_plan"]

ZERO_STAGES = (2, 3)
BF16 = 2
FP32 = 4


@dataclass(frozen=True)
class ZeroBuckets:
    """The ZeRO config's sizes, in elements, as the HF Trainer fills HF's documented "auto" values
    (``transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig.trainer_config_finalize``)."""

    reduce_bucket_size: int
    """``reduce_bucket_size`` = hidden²."""
    prefetch_bucket_size: int
    """``stage3_prefetch_bucket_size`` = 0.9 hidden²."""
    persistence_threshold: int
    """``stage3_param_persistence_threshold`` = 10 hidden."""
    max_reuse_distance: int = 10**9
    """``stage3_max_reuse_distance`` (1e9 in HF's config and DeepSpeed's default)."""
    max_live_parameters: int = 10**9
    """``stage3_max_live_parameters`` (1e9 in HF's config and DeepSpeed's default)."""

    @classmethod
    def for_hidden(cls, hidden: int) -> ZeroBuckets:
        return cls(reduce_bucket_size=hidden * hidden, prefetch_bucket_size=int(0.9 * hidden * hidden),
                   persistence_threshold=10 * hidden)


def hf_deepspeed_config(stage: int, buckets: ZeroBuckets) -> dict:
    """The HF Trainer's ``deepspeed=`` dict for a ZeRO-``stage`` plan: HF's documented ``ds_config_zero2.json`` /
    ``ds_config_zero3.json`` (no optimizer section: the Trainer's own AdamW, ``zero_allow_untested_optimizer``) with
    the bucket sizes the plan was sized for written out (the values the Trainer's "auto" resolves them to for this
    model); batch sizes and clipping stay "auto" (the Trainer fills them from its arguments)."""
    zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                  "reduce_bucket_size": buckets.reduce_bucket_size}
    if stage == 2:
        zero.update(allgather_partitions=True, allgather_bucket_size=int(2e8), reduce_scatter=True)
    else:
        zero.update(sub_group_size=int(1e9), stage3_prefetch_bucket_size=buckets.prefetch_bucket_size,
                    stage3_param_persistence_threshold=buckets.persistence_threshold,
                    stage3_max_live_parameters=buckets.max_live_parameters,
                    stage3_max_reuse_distance=buckets.max_reuse_distance,
                    stage3_gather_16bit_weights_on_model_save=True)
    return {"bf16": {"enabled": "auto"}, "zero_optimization": zero, "gradient_clipping": "auto",
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto", "zero_allow_untested_optimizer": True}


@dataclass
class ZeroPlan:
    """Rank 0's ZeRO terms in bytes (``parts`` of the estimate's moments, named as in its breakdown)."""

    stage: int
    world_size: int
    buckets: ZeroBuckets
    weights: int
    """bf16 module parameters each rank holds."""
    master: int
    """fp32 master partition of the trainable parameters."""
    states: int
    """Optimizer states of the master partition."""
    grad_partition: int
    """The reduced bf16 gradient partition (contiguous_gradients)."""
    reduce_buckets: int
    """The ipg buckets gradients are copied into before they are reduced."""
    step_grad: int
    """The fp32 copy of the gradient partition the optimizer steps with."""
    step_temp: int
    """foreach AdamW's sqrt(v) temporary over the largest group's master partition."""
    gathered_layers: list[int] = field(default_factory=list)
    """Stage 3: per layer, bf16 bytes of its non-persistent parameters its backward uses."""
    gathered_root: int = 0
    """Stage 3: bf16 bytes of the embeddings and head the backward uses."""
    live_cap: int = 0
    """Stage 3: ``stage3_max_live_parameters`` in bf16 bytes."""
    reuse_kept: list[int] = field(default_factory=list)
    """Stage 3: per layer, bf16 bytes kept gathered from its forward by the reuse distance (cap or not)."""
    reuse_kept_root: int = 0
    """Stage 3: embeddings/head bytes the reuse distance keeps."""

    def _gathered(self, upto: int) -> int:
        kept = self.reuse_kept_root + sum(self.reuse_kept[:upto])
        used = self.gathered_root + sum(self.gathered_layers[:upto])
        return max(kept, min(used, self.live_cap))
    head_input: int = 0
    """Stage 3: the frozen head's bf16 input, which DeepSpeed's ``LinearFunctionForZeroStage3`` saves."""
    grads_in_flight: list[int] = field(default_factory=list)
    """Per layer: unreduced bf16 gradients of that layer that bypass the bucket (larger than it) while it runs."""
    formulas: dict[str, str] = field(default_factory=dict)

    def terms_at_loss(self) -> dict[str, int]:
        out = {"weights": self.weights, "zero master": self.master, "optimizer": self.states}
        if self.stage == 3:
            out["zero gradient partition"] = self.grad_partition
            out["zero reduce buckets"] = self.reduce_buckets
            out["zero gathered"] = self._gathered(len(self.gathered_layers))
            if self.head_input:
                out["zero linear inputs"] = self.head_input
        return out

    def terms_in_backward(self, i: int) -> dict[str, int]:
        out = {"weights": self.weights, "zero master": self.master, "optimizer": self.states,
               "zero gradient partition": self.grad_partition, "zero reduce buckets": self.reduce_buckets,
               "gradients": self.grads_in_flight[i] if self.grads_in_flight else 0}
        if self.stage == 3:
            # layers above i are released by their backward (next used by the next step, past the trace)
            out["zero gathered"] = self._gathered(i + 1)
        return out

    def terms_at_step(self) -> dict[str, int]:
        return {"weights": self.weights, "zero master": self.master, "optimizer": self.states,
                "zero gradient partition": self.grad_partition,
                "zero reduce buckets": self.reduce_buckets if self.stage == 3 else 0,
                "zero fp32 gradients": self.step_grad, "optimizer temporaries": self.step_temp}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _params(profile: ModelProfile, cfg: TrainConfig, layers) -> tuple[list[list[tuple[int, bool, str]]], list[int], int]:
    """Per layer, every parameter as (elements, trainable, module name: its Linear's, "lora" or "norm"); the root's
    (embeddings, head, final norm) elements and the final norm's."""
    targets = (lora_target_names(cfg.lora_config.target_modules, profile.linear_modules) if cfg.method != "full"
               else frozenset())
    rank = cfg.lora_config.rank if cfg.method != "full" else 0
    full = cfg.method == "full"
    per_layer = []
    for layer in layers:
        params: list[tuple[int, bool, str]] = []
        for lin in layer.linears:
            elements = lin.in_features * lin.out_features
            if cfg.method == "qlora" and lin.quantizable:  # packed NF4 (2 codes a byte) viewed as bf16 elements
                elements = _ceil_div(_ceil_div(elements, 2), BF16)
            for _ in range(lin.count):
                params.append((elements, full, lin.name))
                if lin.bias:
                    params.append((lin.out_features, full, lin.name))
                if not full and lora_selects(lin, targets):
                    r = rank * lin.lora_rank_factor
                    params += [(r * lin.in_features, True, "lora"), (r * lin.out_features, True, "lora")]
        if layer.norm_params:
            params.append((layer.norm_params, full, "norm"))  # under any persistence threshold however split
        if layer.router_params:
            params.append((layer.router_params, full, "router"))
        per_layer.append(params)
    root = [profile.embedding_params]
    if profile.lm_head_params:
        root.append(profile.lm_head_params)
    final_norm = profile.total_params - sum(profile.layer_params) - sum(root)
    root.append(final_norm)
    return per_layer, root, final_norm


def _grads_in_flight(per_layer: list[list[tuple[int, bool, str]]], bucket: int) -> list[int]:
    """Per layer, the most bf16 bytes of gradients larger than the bucket alive at once in its backward.

    Such a gradient bypasses the ipg bucket (``extra_large_param_to_reduce``, one pending at a time) and is reduced,
    and freed outside rank 0's partition, when the next gradient that overflows the bucket arrives
    (``reduce_independent_p_g_buckets_and_remove_grads`` -> ``reduce_ipg_grads``): while a layer runs backward, the
    pending one (perhaps the layer above's) and the one just made. Backward runs a layer's Linears last to first."""
    out, pending = [], 0
    for layer in reversed(per_layer):
        most = pending
        for e, trainable, _ in reversed(layer):
            if trainable and e > bucket:
                most = max(most, pending + BF16 * e)
                pending = BF16 * e
        out.append(most)
    return out[::-1]


def _inputs_require_grad(cfg: TrainConfig) -> bool:
    """Whether the embedding's output requires grad: under gradient checkpointing transformers'
    ``gradient_checkpointing_enable`` calls ``enable_input_require_grads`` (for any model whose input is input_ids),
    so under ZeRO-3 the embedding's backward hooks run (its parameters are in the backward's trace, gathered ahead
    like a layer's) and every module of the first layer runs backward, after recomputing its forward (traced: LoRA
    and QLoRA rows with checkpointing hold the embedding and the first layer's q/k/v gathered at the loss)."""
    return cfg.gradient_checkpointing


def _reads_layer_input(fam, config) -> set[str]:
    """Linears that read a decoder layer's (normed) input: attention's input projections, and in a parallel block
    the MLP's too (the registry lists each block's output projection last)."""
    names = {a.path.rsplit(".", 1)[-1] for a in fam.entry.attention[:-1]}
    if fam.entry.is_parallel(config):
        names |= {m.path.rsplit(".", 1)[-1] for m in fam.entry.mlp[:-1]}
    return names


def zero_plan(profile: ModelProfile, cfg: TrainConfig, layers, *, world_size: int, stage: int,
              trainable_params: int, decay_params: int, state_bytes_per_param: int, quant_state_bytes: int = 0,
              buckets: ZeroBuckets | None = None, head_input_bytes: int = 0) -> ZeroPlan:
    """Rank 0's ZeRO-``stage`` terms for ``world_size`` data-parallel ranks.

    Every stage (``stage_1_and_2.py`` / ``stage3.py``): the trainable bf16 parameters are flattened per param group
    and each rank keeps the fp32 master copy of its 1/n partition (``single_partition_of_fp32_groups`` /
    ``fp32_partitioned_groups_flat``) and the optimizer's states of it; the states are fp32 whatever the weights.
    The optimizer steps on an fp32 copy of the reduced gradient partition (stage 2: ``step`` flattens
    ``averaged_gradients`` ``.to(fp32)``; stage 3: ``_prepare_fp32_grad_for_sub_group``), beside foreach AdamW's
    state-sized temporary.

    Stage 2: every rank holds the whole bf16 module. With ``contiguous_gradients`` each gradient is copied into an ipg
    bucket of ``reduce_bucket_size`` elements, two of them under ``overlap_comm`` (``setup_buckets``), reduced when
    full, and rank 0's share copied into ``grads_in_partition`` (``copy_grads_in_partition``: the bf16 size of the
    parameters that overlap its partition), which lives until the step; a gradient larger than the bucket bypasses
    it (``extra_large_param_to_reduce``) and lives until its reduction.

    Stage 3: parameters are partitioned too (``partition_parameters.py``: each one's ``ds_tensor``, 1/n of it), except
    that a parameter under ``stage3_param_persistence_threshold`` elements stays gathered (``ds_persist``). The
    gradient partitions live in one flat buffer from the start (``grad_partitions_flat_buffer``) beside one ipg bucket.
    Once a step's trace is complete (``partitioned_param_coordinator.py``), every module fetch starts a prefetch round
    that walks the recorded parameter queue, forward then backward occurrences, gathering what is not available until
    ``stage3_prefetch_bucket_size`` elements are in flight, and marks each parameter it walks past with the step of that
    occurrence; a parameter whose mark lies ahead is not released ("Don't release params whose reuse was skipped by
    prefetch", ``__params_to_release``), nor one whose next use is within ``stage3_max_reuse_distance``. The queue runs
    ahead of the modules (one module's parameters plus a bucket a round), so it reaches the backward's occurrences
    during forward and gathers them, up to ``stage3_max_live_parameters`` available elements
    (``max_params_to_prefetch``). At the loss rank 0 therefore holds, gathered, the parameters the backward uses, up to
    that cap, whatever the reuse distance (traced at 1e9 and 1e6: the same peak); a layer's are released by its
    backward. Not used by the backward, and so released in forward: a frozen embedding, and under LoRA the first
    layer's frozen modules that read its input.

    The cap (``stage3_max_live_parameters``) bounds only the prefetch: a layer whose backward lies within
    ``stage3_max_reuse_distance`` elements of fetches is kept whatever the cap (traced: a tiny model under a 1e6 cap
    holds all of its 4.2M parameters). What bounds the gathered parameters of a model larger than both (7-70B under
    HF's 1e9) is not traced: this plan takes the cap.

    ZeRO-3 replaces ``torch.nn.functional.linear`` with ``zero3_linear_wrap`` (``memory_efficient_linear``, on by
    default), whose ``LinearFunctionForZeroStage3`` saves every Linear's input whether its weight trains or not: under
    LoRA/QLoRA the frozen head's input (``head_input_bytes``, the final norm's bf16 output, which torch's linear would
    not keep) lives until the head's backward. The layers' frozen Linears read inputs their adapters keep anyway.

    QLoRA (TRL/axolotl's sharded QLoRA: ``bnb_4bit_quant_storage=torch.bfloat16``): a packed NF4 weight is a bf16
    parameter of half as many elements as its codes, partitioned and gathered as such; its quantisation state
    (``quant_state_bytes``: absmax, code book) is not a parameter and stays whole on every rank."""
    n = world_size
    b = buckets or ZeroBuckets.for_hidden(profile.hidden_size)
    per_layer, root, final_norm = _params(profile, cfg, layers)
    all_params = [p for layer in per_layer for p in layer] + [(r, cfg.method == "full", "root") for r in root]
    total = sum(e for e, _, _ in all_params)
    master = FP32 * _ceil_div(trainable_params, n)
    states = state_bytes_per_param * _ceil_div(trainable_params, n)
    step_grad = FP32 * _ceil_div(trainable_params, n)
    step_temp = FP32 * _ceil_div(decay_params, n)
    grad_partition = BF16 * _ceil_div(trainable_params, n)
    formulas = {
        "zero master": f"{trainable_params:,} trainable x 4 B (fp32) / {n} ranks",
        "zero gradient partition": f"{trainable_params:,} trainable x 2 B (bf16) / {n} ranks",
        "zero fp32 gradients": f"{trainable_params:,} trainable x 4 B / {n} ranks: the step's fp32 gradient copy",
    }
    formulas["optimizer"] = f"{state_bytes_per_param} B x {trainable_params:,} trainable / {n} ranks"
    formulas["weights"] = (f"{total:,} params x 2 B, whole on every rank (ZeRO-2 partitions no parameters)" if stage == 2
                           else f"{total:,} params x 2 B / {n} ranks (each one's ds_tensor) + the persistent ones whole")
    if quant_state_bytes:
        formulas["weights"] = ("NF4 packed 2 codes a byte in bf16 elements; " + formulas["weights"]
                               + f" + {quant_state_bytes:,} B of quantisation state whole on every rank")
    in_flight = _grads_in_flight(per_layer, b.reduce_bucket_size)
    if stage == 2:
        reduce_buckets = 2 * BF16 * b.reduce_bucket_size
        formulas["zero reduce buckets"] = f"2 ipg buffers (overlap_comm) x {b.reduce_bucket_size:,} x 2 B"
        return ZeroPlan(stage=2, world_size=n, buckets=b, weights=BF16 * total + quant_state_bytes, master=master,
                        states=states,
                        grad_partition=grad_partition, reduce_buckets=reduce_buckets, step_grad=step_grad,
                        step_temp=step_temp, grads_in_flight=in_flight, formulas=formulas)

    persist = sum(e for e, _, _ in all_params if e <= b.persistence_threshold)
    weights = BF16 * sum(_ceil_div(e, n) for e, _, _ in all_params) + BF16 * persist + quant_state_bytes
    reduce_buckets = BF16 * b.reduce_bucket_size
    formulas["zero reduce buckets"] = f"1 ipg bucket x {b.reduce_bucket_size:,} x 2 B"
    gathered_each = [BF16 * sum(e for e, _, _ in layer if e > b.persistence_threshold) for layer in per_layer]
    head = profile.lm_head_params or 0
    frozen_embedding = cfg.method != "full" and not profile.tie_word_embeddings and not _inputs_require_grad(cfg)
    if frozen_embedding and per_layer:
        # nothing below the first layer needs a gradient: the modules reading its input run no backward, so the
        # step's trace meets them only in forward
        unused = _reads_layer_input(get_family(profile.config), profile.config)
        gathered_each[0] -= BF16 * sum(e for e, t, name in per_layer[0]
                                       if name in unused and not t and e > b.persistence_threshold)
    gathered_root = BF16 * (head if head > b.persistence_threshold else 0)
    if not frozen_embedding:  # a tied embedding is the head's weight; an untied trainable one runs its backward
        gathered_root += BF16 * profile.embedding_params
    # the reuse distance keeps, cap or not, a layer whose backward is nearer than it: between its forward and its
    # backward the layers above it and the head (and final norm) are fetched twice
    numel = [sum(e for e, _, _ in layer) for layer in per_layer]
    reuse_kept = [g if 2 * (sum(numel[i + 1:]) + head + final_norm) < b.max_reuse_distance else 0
                  for i, g in enumerate(gathered_each)]
    reuse_kept_root = BF16 * (head if head > b.persistence_threshold else 0)  # used again at once
    if gathered_root > reuse_kept_root and 2 * sum(e for e, _, _ in all_params) < b.max_reuse_distance:
        reuse_kept_root = gathered_root
    return ZeroPlan(stage=3, world_size=n, buckets=b, weights=weights, master=master, states=states,
                    grad_partition=grad_partition, reduce_buckets=reduce_buckets, step_grad=step_grad,
                    step_temp=step_temp, gathered_layers=gathered_each, gathered_root=gathered_root,
                    live_cap=BF16 * b.max_live_parameters, reuse_kept=reuse_kept, reuse_kept_root=reuse_kept_root,
                    head_input=head_input_bytes if cfg.method != "full" else 0, grads_in_flight=in_flight,
                    formulas=formulas)
