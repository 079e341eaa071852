"""`plan`: a request in, a `PlanReport` out — model, dataset, GPU, memory, tiers, time, cost, risks.

    from aegis import plan
    report = plan("qlora llama-3.1-8b on 3090")
    report = plan(model="llama-3.1-8b", method="qlora", gpu="3090", dataset="./data/support.jsonl")
    report = plan("qlora llama-3.1-8b on a100", trainer="trl", transformers_version="4.48.1", lora_dropout=0.1)

The stack (trainer, transformers version, k-bit preparation, Liger, checkpointing variant) is what the request
says, else detected from installed package metadata (`aegis.planning.stack`; ``detect_stack=False`` turns that off), else
the default; `PlanReport.stack` and `PlanReport.stack_source` say which.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pydantic import ValidationError

from aegis.planning import hardware
from aegis.errors import InvalidConfigError, RequestParseError, UnknownModelError
from aegis.models.resolve import match_model, resolve_model
from aegis.planning.memory.estimate import estimate
from aegis.planning.memory.stack_effects import profile_for_stack
from aegis.recipe import recipe
from aegis.planning.stack import check_model_in_stack, resolve_stack
from aegis.planning.sanity import risks_and_notes
from aegis.schema import (
    GPU,
    DatasetProfile,
    LoRAConfig,
    ModelProfile,
    ModelSummary,
    MultiGPU,
    PlanReport,
    PlanRequest,
    Precision,
    Throughput,
    Tier,
    default_lora_targets,
    lora_target_names,
)
from aegis.planning.solver import Solution, relative_speed, solve
from aegis.planning.throughput import costs, tokens_per_s_range
from aegis.units import gib

__all__ = ["plan", "plan_request", "default_precision", "DEFAULT_SEQ_LEN", "DEFAULT_EFFECTIVE_BATCH", "DEFAULT_EPOCHS", "DEFAULT_LORA_RANK"]

DEFAULT_SEQ_LEN = 1024
"""Sequence length without a dataset (TRL's SFT default)."""
DEFAULT_EFFECTIVE_BATCH = 16
DEFAULT_EPOCHS = 3.0
DEFAULT_LORA_RANK = recipe().lora.rank
_DDP_EFFICIENCY = (0.85, 0.95)
_FSDP_EFFICIENCY = (0.70, 0.90)
_PADDING_OVERHEAD = 1.25
"""Dynamic padding: a batch is padded to its longest row; tokens processed <= 1.25 x real tokens."""


def default_precision(gpu: GPU) -> Precision:
    """bf16 where the card has bf16 tensor cores; else fp16 mixed precision (fp16 autocast with loss scaling, which
    for LoRA/QLoRA keeps the frozen base in fp16): on a T4 or V100 bf16 runs emulated at the fp32 rate."""
    return "bf16" if gpu.bf16_native else "fp16_mixed"


def plan(request: str | PlanRequest | None = None, *, sample_rows: int = 1000, progress: bool = False,
         detect_stack: bool = True, **fields) -> PlanReport:
    """Plan a fine-tune from free text and/or fields of `PlanRequest` (fields win over the text)."""
    from aegis.planning.parse import parse_request_lenient

    said: tuple[str, ...] = ()  # how the text's words were read ('instuct' as instruct, an Ollama tag)
    if isinstance(request, str):
        result = parse_request_lenient(request)
        parsed, said = result.strict(), result.notes
    else:
        parsed = request or PlanRequest()
    given = {k: v for k, v in fields.items() if v is not None}
    _check_fields(given)
    try:
        override = PlanRequest(**given)
    except ValidationError as err:
        from aegis._validation import validation_line

        raise RequestParseError(f"bad plan argument: {validation_line(err, model=PlanRequest)}") from None
    merged = parsed.merged(override)
    if merged.model is None and merged.dataset:
        _explain_model_folder(merged.dataset)
    if merged.model is None and isinstance(request, str):
        _explain_missing_model(request)
    report = plan_request(merged, sample_rows=sample_rows, progress=progress, detect_stack=detect_stack)
    used = {n.split(" (config used for ")[0] for n in report.notes if " (config used for " in n}
    read = tuple(n for n in said if n not in report.notes and merged.model == parsed.model
                 and n.split(" (config used for ")[0] not in used)  # the report says which config it used
    return report.model_copy(update={"notes": read + report.notes}) if read else report


def _check_fields(fields: dict) -> None:
    """Numbers and versions given as fields (the CLI's flags, the Python API, the agent): the free text's ranges
    (`aegis.planning._parse_vocab._BOUNDS`), finite, whole where they count; RequestParseError naming the value and range."""
    from aegis.planning._parse_vocab import _BOUNDS, _INTEGER_SETTINGS
    from aegis._validation import check_range
    from aegis.planning.parse import transformers_version_problem

    for name, value in fields.items():
        if value is None:
            continue
        if name in _BOUNDS:
            low, high, _label = _BOUNDS[name]
            problem = check_range(name, value, low, high, integer=name in _INTEGER_SETTINGS)
            if problem is not None:
                raise RequestParseError(problem)
        elif name == "transformers_version":
            problem = transformers_version_problem(value)
            if problem is not None:
                raise RequestParseError(problem)


def _explain_model_folder(dataset: str) -> None:
    """No model named, and the one folder named (read as the dataset) holds no data files: it was meant as the model
    and lacks config.json; say so rather than 'no model named'."""
    import os

    path = os.path.expanduser(dataset)
    try:
        if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json")):
            return
        names = os.listdir(path)
    except OSError:
        return
    data = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow", ".txt", ".gz", ".zst")
    if any(n.lower().endswith(data) for n in names) or any(os.path.isdir(os.path.join(path, n)) for n in names):
        return
    raise RequestParseError(
        f"no model named: the folder {dataset} has no config.json (and no data files), so it is neither a model "
        "folder nor a dataset; for a model, add its config.json (transformers' save_pretrained writes one) or pass "
        "--model path/to/config.json; `aegis models` lists the bundled models"
    )


def _explain_missing_model(text: str) -> None:
    """A word the parser could not place that is close to a bundled model: say which it may be."""
    from aegis.models.resolve import canonical_model_id
    from aegis.planning.parse import parse_request_lenient

    for word in parse_request_lenient(text).unparsed:
        try:
            canonical_model_id(word)
        except UnknownModelError as err:
            if "did you mean" in str(err):
                raise RequestParseError(str(err)) from None


def plan_request(
    req: PlanRequest, *, sample_rows: int = 1000, progress: bool = False, dataset_profile: DatasetProfile | None = None,
    detect_stack: bool = True,
) -> PlanReport:
    """Plan a parsed request. `dataset_profile`: an analysis of `req.dataset` already made (reused, not redone)."""
    _check_fields(req.model_dump(exclude_none=True))
    if not req.model:
        raise RequestParseError("no model named: say which, e.g. 'qlora llama-3.1-8b on 3090'; `aegis models` lists them")
    if not req.gpu:
        raise RequestParseError("no GPU named: say which, e.g. '... on 3090' or '... on 2x a100 80gb'; `aegis gpus` lists them")
    stack, stack_source = resolve_stack(
        trainer=req.trainer, transformers_version=req.transformers_version, kbit_prep=req.kbit_prep, liger=req.liger,
        checkpointing=req.checkpointing_mode, detect=detect_stack,
    )
    profile = profile_for_stack(resolve_model(req.model), stack)  # transformers 4.x: separate expert Linears
    if profile.max_position_embeddings < 1:  # else 'seq_len must be a positive integer, got 0' names no key
        raise InvalidConfigError(f"{profile.model_id}: config.json's max_position_embeddings is "
                                 f"{profile.max_position_embeddings}: a model needs at least 1 position; check the file")
    gpu = hardware.find_gpu(req.gpu)
    method = req.method or "lora"
    gpu_count = req.gpu_count or 1
    notes: list[str] = []
    missing = check_model_in_stack(profile.config.get("model_type"), stack, stack_source)
    if missing:
        notes.append(missing)
    matched = match_model(req.model)
    if matched.note:  # e.g. an instruct name planned with its base's identical config.json: say which file
        notes.append(matched.note)
    if req.method is None:
        notes.append("method not given: planned LoRA (say 'qlora' or 'full' for the others)")
    dataset = dataset_profile
    if req.dataset and dataset is None:
        from aegis.data.profile import analyze_dataset

        dataset = analyze_dataset(req.dataset, model=profile, seq_len=req.seq_len, sample_rows=sample_rows, progress=progress)
    if req.seq_len:
        seq_len = req.seq_len
    elif dataset is not None:
        seq_len = dataset.seq_len
    else:
        seq_len = min(DEFAULT_SEQ_LEN, profile.max_position_embeddings)
    if seq_len > profile.max_position_embeddings and profile.position_embedding_params:
        limit = profile.max_position_embeddings  # learned positions (GPT-2): there is no embedding past the last row
        if req.seq_len:
            raise RequestParseError(
                f"{profile.model_id} has learned positions for {limit:,} tokens, so seq {seq_len:,} cannot run: "
                f"ask for seq {limit:,} or less"
            )
        notes.append(f"the dataset's seq {seq_len:,} is cut to the model's {limit:,} learned positions (longer samples "
                     "are truncated)")
        seq_len = limit
    elif seq_len > profile.max_position_embeddings:
        notes.append(f"seq {seq_len:,} exceeds the model's {profile.max_position_embeddings:,} positions")
    rank = req.lora_rank or DEFAULT_LORA_RANK
    targets = req.lora_targets or default_lora_targets(profile.linear_modules)
    lora = LoRAConfig(rank=rank, alpha=recipe().lora.alpha(rank), target_modules=targets,
                      dropout=req.lora_dropout or recipe().lora.dropout) if method != "full" else None
    eff = req.effective_batch_size or max(DEFAULT_EFFECTIVE_BATCH, (req.micro_batch_size or 1) * gpu_count)
    epochs = req.epochs or DEFAULT_EPOCHS
    eval_seq = dataset.tokens.max if dataset is not None else seq_len
    precision = req.precision or default_precision(gpu)
    if req.precision is None and precision != "bf16":
        notes.append(f"{gpu.name} has no bf16 tensor cores (compute capability {gpu.compute_capability}): planned "
                     f"fp16 mixed precision (fp16=True, loss scaling) at {gpu.tflops(precision):g} TFLOPS; "
                     "say 'bf16' to plan emulated bf16")
    if req.autocast is False and precision in ("bf16_mixed", "fp16_mixed"):
        raise InvalidConfigError(f"{precision} runs fp32 or fp16 weights under autocast: drop --no-autocast, or plan bf16")
    kwargs = dict(method=method, seq_len=seq_len, effective_batch_size=eff, lora=lora,
                  optimizer=req.optimizer or "adamw", precision=precision,
                  micro_batch_size=req.micro_batch_size, gradient_checkpointing=req.gradient_checkpointing,
                  gpu_count=gpu_count, eval_seq_len=eval_seq, stack=stack, autocast=req.autocast)
    zero = req.zero_stage
    if req.sharding is not None:
        _check_sharding_request(req.sharding, gpu_count, zero)
    if zero is not None:
        _check_zero_request(zero, gpu_count, req.autocast)
        kwargs["autocast"] = False  # accelerate leaves DeepSpeed's bf16 to the engine: no torch.autocast
    solution = solve(profile, gpu, **kwargs) if zero is None else solve(profile, gpu, fsdp_shards=gpu_count,
                                                                        zero_stage=zero, **kwargs)
    multi = None
    if gpu_count > 1:
        solution, multi = (_multi_gpu(profile, gpu, gpu_count, solution, kwargs, asked=req.sharding) if zero is None
                           else _deepspeed(profile, gpu, gpu_count, zero, solution, kwargs))
        from dataclasses import replace

        from aegis.planning.memory.multi_gpu import multi_gpu_device_level  # context, cuBLAS and NCCL per GPU

        strategy = {"profile": profile, "strategy": multi.assumed if multi is not None else None}
        solution = replace(solution, recommended=multi_gpu_device_level(gpu, solution.recommended, gpu_count, **strategy),
                           aggressive=multi_gpu_device_level(gpu, solution.aggressive, gpu_count, **strategy))
    if gpu_count == 1:
        solution = _device_level(profile, gpu, solution, dataset.row_lengths if dataset else None)
    rec = solution.recommended
    nothing = None if rec is not None else _nothing_fits(profile, gpu, gpu_count, solution, kwargs)
    throughput, cost_list = None, []
    steps_per_epoch = None
    if dataset is not None:  # at the effective batch the report states: the recommended tier's, across the GPUs
        steps_per_epoch = math.ceil(dataset.num_rows / (rec.config.effective_batch_size * gpu_count if rec else eff))
    if rec is not None:
        efficiency = (1.0, 1.0) if gpu_count == 1 else (_FSDP_EFFICIENCY if multi and multi.assumed == "fsdp" else
                                                        (multi.efficiency_low, multi.efficiency_high)
                                                        if multi and multi.assumed == "deepspeed" else _DDP_EFFICIENCY)
        lo, hi, basis, source = tokens_per_s_range(profile, rec.config, gpu, gpu_count=gpu_count, efficiency=efficiency)
        if dataset is not None:
            mean_tokens = min(dataset.tokens.mean, seq_len)
            epoch_tokens = (dataset.num_rows * mean_tokens, dataset.num_rows * mean_tokens * _PADDING_OVERHEAD)
            ep = (epoch_tokens[0] / hi / 3600, epoch_tokens[1] / lo / 3600)
            throughput = Throughput(tokens_per_s_low=lo, tokens_per_s_high=hi, source=source, basis=basis,
                                    epoch_hours_low=ep[0], epoch_hours_high=ep[1],
                                    total_hours_low=ep[0] * epochs, total_hours_high=ep[1] * epochs)
            cost_list = costs(gpu, gpu_count, (throughput.total_hours_low, throughput.total_hours_high))
            if gpu.local:
                cost_list += _counterfactual(profile, rec, gpu, epoch_tokens, epochs, kwargs)
        else:
            throughput = Throughput(tokens_per_s_low=lo, tokens_per_s_high=hi, source=source, basis=basis,
                                    epoch_hours_low=0, epoch_hours_high=0, total_hours_low=0, total_hours_high=0)
            notes.append("no dataset: time and cost need its size; add 'with ./data.jsonl'")
    report = PlanReport(
        request=req,
        model=ModelSummary(model_id=profile.model_id, architecture=profile.architecture,
                           family_description=profile.family_description, total_params=profile.total_params,
                           active_params_per_token=profile.active_params_per_token, vocab_size=profile.vocab_size,
                           num_layers=profile.num_layers, hidden_size=profile.hidden_size, num_experts=profile.num_experts,
                           num_experts_per_tok=profile.num_experts_per_tok, source=profile.source,
                           lora_names=tuple(sorted(lora_target_names(("all-linear",), profile.linear_modules)))),
        dataset=dataset, gpu=gpu, gpu_count=gpu_count, usable_bytes=gpu.usable_bytes, method=method, lora=lora,
        trainable_params=profile.trainable_params(method, lora), epochs=epochs,
        num_rows=dataset.num_rows if dataset else None, steps_per_epoch=steps_per_epoch,
        recommended=rec, aggressive=solution.aggressive, fallbacks=tuple(solution.fallbacks), multi_gpu=multi,
        throughput=throughput, costs=tuple(cost_list), notes=tuple(notes + solution.notes), nothing_fits=nothing,
        stack=stack, stack_source=stack_source,
    )
    risks, more_notes = risks_and_notes(report, profile)
    return report.model_copy(update={"risks": tuple(risks), "notes": report.notes + tuple(more_notes)})


def _device_level(profile: ModelProfile, gpu: GPU, solution: Solution, row_lengths: tuple[int, ...] | None = None) -> Solution:
    """Judge the reported tiers on what the device shows (`aegis.planning.memory.device`): the recommended and the
    aggressive tier get their reserved peak; a recommended tier whose reserved segments do not fit gives way
    to the first fallback that does, and one that then keeps less than the comfortable headroom (`comfort_bytes`)
    to the first fallback that keeps it (the recommended tier's promise), else it says how little it keeps."""
    from dataclasses import replace

    from aegis.planning.memory.device import device_check
    from aegis.planning.solver import AGGRESSIVE_HEADROOM_BYTES, AGGRESSIVE_OMITTED, AGGRESSIVE_SUMMARY, comfort_bytes

    rec, agg, notes = solution.recommended, solution.aggressive, list(solution.notes)
    fallbacks, agg_checked = solution.fallbacks, False
    comfort = comfort_bytes(gpu)

    def first_fallback(ok: Callable[[Tier], bool]) -> Tier | None:
        """The first fallback ``ok`` accepts at the device level, as the recommended tier; the chain then goes on
        below it."""
        nonlocal fallbacks
        for i, fb in enumerate(solution.fallbacks):
            checked = device_check(profile, gpu, fb, row_lengths)
            if ok(checked):
                fallbacks = solution.fallbacks[i + 1:]
                return checked.model_copy(update={"name": "recommended"})
        return None

    if rec is not None:
        checked = device_check(profile, gpu, rec, row_lengths)
        if not checked.fits:
            notes.append(
                f"the recommended config's live tensors fit but the caching allocator would reserve "
                f"{gib(checked.memory.reserved_bytes or 0, 1)}: planned the first fallback that fits at the device level"
            )
            checked = first_fallback(lambda c: c.fits)
            if checked is None:  # none fits at the device level either: nothing fits, and no chain is left
                fallbacks = []
        elif checked.headroom_bytes < comfort <= rec.headroom_bytes:
            kept = first_fallback(lambda c: c.fits and c.headroom_bytes >= comfort)
            on_device = f"{gib(comfort)} headroom on the device (reserved segments counted)"
            if kept is not None:
                if agg is None and checked.headroom_bytes < AGGRESSIVE_HEADROOM_BYTES:  # it is the aggressive tier
                    agg, agg_checked = checked.model_copy(update={"name": "aggressive", "summary": AGGRESSIVE_SUMMARY}), True
                    notes = [n for n in notes if n != AGGRESSIVE_OMITTED]
                notes.append(
                    f"micro batch {rec.config.micro_batch_size} keeps only {gib(checked.headroom_bytes, 1)} once the "
                    f"caching allocator's reserved segments are counted: planned micro batch "
                    f"{kept.config.micro_batch_size}, which keeps {gib(kept.headroom_bytes, 1)}"
                )
                summary = "; ".join(s for s in (f"fastest config with >= {on_device}", kept.summary) if s)
                checked = kept.model_copy(update={"summary": summary})
            else:
                checked = checked.model_copy(update={
                    "summary": f"fastest config that fits; {gib(checked.headroom_bytes, 1)} headroom on the device, "
                               f"under the comfortable {on_device}: none keeps more"})
        rec = checked
    if agg is not None and not agg_checked:
        agg = device_check(profile, gpu, agg, row_lengths)
        if not agg.fits:
            agg = None
    return replace(solution, recommended=rec, aggressive=agg, fallbacks=fallbacks, notes=notes)


def _multi_gpu(profile: ModelProfile, gpu: GPU, n: int, ddp: Solution, kwargs: dict,
               asked: str | None = None) -> tuple[Solution, MultiGPU]:
    """DDP or FSDP FULL_SHARD over ``n`` GPUs: the one the request ``asked`` for, else the faster one that fits."""
    # a request that asks for DDP never takes FSDP's configuration: its solve is skipped
    fsdp = solve(profile, gpu, fsdp_shards=n, **kwargs) if asked != "ddp" else None

    def speed(solution: Solution, efficiency: tuple[float, float]) -> tuple[bool, float]:
        """Whether the config is as asked (no memory savings), then its speed per GPU with scaling."""
        rec = solution.recommended
        return (not solution.savings, relative_speed(rec.config) * sum(efficiency) / 2) if rec else (False, 0.0)

    if asked is not None:
        use_ddp = asked == "ddp"
    else:
        use_ddp = ddp.recommended is not None and speed(ddp, _DDP_EFFICIENCY) >= speed(fsdp, _FSDP_EFFICIENCY)
    chosen = ddp if use_ddp else fsdp
    # both figures at the configuration the report recommends (else the smallest tried): the section's "micro batch,
    # checkpointing" is then the recommended config's, not the other strategy's
    ref = (chosen.recommended or chosen.smallest).config
    ddp_bytes = estimate(profile, ref, gpu=gpu, ddp=True).total_bytes
    fsdp_bytes = estimate(profile, ref, gpu=gpu, fsdp_shards=n).total_bytes
    reason = _strategy_reason(asked, use_ddp, ddp, fsdp)
    eff = _DDP_EFFICIENCY if use_ddp else _FSDP_EFFICIENCY
    at = f"micro batch {ref.micro_batch_size}, checkpointing {'ON' if ref.gradient_checkpointing else 'OFF'}"
    # the engine's mesh for the same choice: data ranks replicate the model as DDP does, fsdp ranks shard it as
    # FULL_SHARD does (aegis.train.parallel; `aegis run --plan` uses it)
    mesh = {"data": n} if use_ddp else {"fsdp": n}
    return chosen, MultiGPU(gpu_count=n, ddp_bytes=ddp_bytes, fsdp_bytes=fsdp_bytes, assumed="ddp" if use_ddp else "fsdp",
                            reason=reason, compared_at=at, efficiency_low=eff[0], efficiency_high=eff[1], parallel=mesh)


def _strategy_reason(asked: str | None, use_ddp: bool, ddp: Solution, fsdp: Solution | None) -> str:
    """Why the plan assumes DDP or FSDP FULL_SHARD (``fsdp`` is None when DDP was asked for: not solved)."""
    if asked == "ddp":
        return "DDP, as asked" + ("" if ddp.recommended else "; it does not fit: FSDP would shard the model")
    if asked == "fsdp":
        return "FSDP FULL_SHARD, as asked" + ("" if fsdp.recommended else "; it does not fit even sharded")
    if use_ddp:
        return "DDP fits with comfortable headroom and needs no weight gathering"
    if fsdp.recommended is None:
        return "FSDP FULL_SHARD needs the least per GPU, though neither fits"
    if ddp.recommended is None:
        return "FSDP FULL_SHARD: sharding weights, grads and optimizer states over the GPUs is what makes it fit"
    return "FSDP allows a faster config than DDP: a larger micro batch, or fewer memory savings"


def _check_sharding_request(sharding: str, gpu_count: int, zero: int | None) -> None:
    """One-line refusals of a DDP/FSDP request the planner cannot honour."""
    name = sharding.upper()
    if zero is not None:
        raise InvalidConfigError(f"the request names both {name} and DeepSpeed ZeRO-{zero}: keep one (ZeRO-3 shards as "
                                 "FSDP does, through DeepSpeed)")
    if gpu_count < 2:
        raise InvalidConfigError(f"{name} spreads the run over several GPUs: name them ('... on 2x a100 with "
                                 f"{sharding}'), or drop {sharding} for a one-GPU plan")


def _check_zero_request(stage: int, gpu_count: int, autocast: bool | None) -> None:
    """One-line refusals of DeepSpeed requests the ZeRO model does not plan."""
    if stage == 1:
        raise InvalidConfigError("DeepSpeed ZeRO-1 is not modelled (ZeRO-2 partitions the gradients too, for the same "
                                 "communication): ask for zero2 or zero3")
    if stage not in (2, 3):
        raise InvalidConfigError(f"DeepSpeed ZeRO stage {stage} does not exist: ask for zero2 or zero3")
    if gpu_count < 2:
        raise InvalidConfigError(f"DeepSpeed ZeRO-{stage} partitions the model over several GPUs: name them "
                                 f"('... on 8x a100 with zero{stage}'), or drop zero{stage} for a one-GPU plan")
    if autocast:
        raise InvalidConfigError("DeepSpeed's bf16 runs without torch.autocast (accelerate leaves mixed precision to "
                                 "the engine): drop --autocast with zero2/zero3")


def _deepspeed(profile: ModelProfile, gpu: GPU, n: int, stage: int, solution: Solution,
               kwargs: dict) -> tuple[Solution, MultiGPU]:
    """The ZeRO stage the request asked for, with DDP's and FSDP's per-GPU peak at the same configuration beside it."""
    from aegis.planning.memory.zero_stages import ZeroBuckets, hf_deepspeed_config

    ref = (solution.recommended or solution.smallest).config
    zero_bytes = (solution.recommended or solution.smallest).memory.total_bytes
    plain = ref.model_copy(update={"autocast": None})  # DDP and FSDP under the Trainer's own autocast
    ddp_bytes = estimate(profile, plain, gpu=gpu, ddp=True).total_bytes
    fsdp_bytes = estimate(profile, plain, gpu=gpu, fsdp_shards=n).total_bytes
    buckets = ZeroBuckets.for_hidden(profile.hidden_size)
    eff = _FSDP_EFFICIENCY if stage == 3 else _DDP_EFFICIENCY  # ZeRO-3 gathers every layer's parameters twice a step
    reason = (f"as asked: HF Trainer with HF's documented ds_config_zero{stage}.json, its "
              f"'auto' buckets resolved for hidden {profile.hidden_size:,} (reduce_bucket_size "
              f"{buckets.reduce_bucket_size:,}"
              + (f", stage3_prefetch_bucket_size {buckets.prefetch_bucket_size:,}, stage3_param_persistence_threshold "
                 f"{buckets.persistence_threshold:,}" if stage == 3 else "") + "), bf16 without autocast")
    at = f"micro batch {ref.micro_batch_size}, checkpointing {'ON' if ref.gradient_checkpointing else 'OFF'}"
    return solution, MultiGPU(gpu_count=n, ddp_bytes=ddp_bytes, fsdp_bytes=fsdp_bytes, assumed="deepspeed",
                              zero_stage=stage, zero_bytes=zero_bytes, deepspeed=hf_deepspeed_config(stage, buckets),
                              reason=reason, compared_at=at, efficiency_low=eff[0], efficiency_high=eff[1],
                              parallel={"fsdp": n})


def _nothing_fits(profile: ModelProfile, gpu: GPU, gpu_count: int, solution: Solution, kwargs: dict) -> str:
    small = solution.smallest
    parts = [f"even the smallest configuration ({small.summary}) needs "
             f"{gib(small.memory.high_bytes)} on a {gib(gpu.memory_bytes)} {gpu.name}"]
    pinned = {k: None for k in ("micro_batch_size", "gradient_checkpointing") if kwargs[k] is not None}
    if pinned:  # what was asked for is what does not fit: say what the solver would choose instead
        free = solve(profile, gpu, **{**kwargs, **pinned}, **({"fsdp_shards": gpu_count} if gpu_count > 1 else {}))
        if free.recommended is not None:
            cfg, said = free.recommended.config, []
            if kwargs["micro_batch_size"] not in (None, cfg.micro_batch_size):
                said.append(f"micro batch {cfg.micro_batch_size:,} instead of {kwargs['micro_batch_size']:,}")
            if kwargs["gradient_checkpointing"] not in (None, cfg.gradient_checkpointing):
                said.append(f"checkpointing {'ON' if cfg.gradient_checkpointing else 'OFF'} instead of "
                            f"{'ON' if kwargs['gradient_checkpointing'] else 'OFF'}")
            if said:
                parts.append(", ".join(said))
    qlora = {**kwargs, "method": "qlora", "lora": kwargs["lora"] or LoRAConfig()}
    if kwargs["method"] != "qlora":
        q = solve(profile, gpu, **qlora)
        if q.recommended or q.fallbacks:
            parts.append("QLoRA fits on this GPU")
    if kwargs["method"] != "full" and len(parts) == 1:
        v4 = _v4_qlora(profile, gpu, qlora, gpu_count)
        if v4:
            parts.append(v4)
    for other in hardware.list_gpus():
        if other.memory_bytes <= gpu.memory_bytes:
            continue
        s = solve(profile, other, **kwargs)
        if s.recommended or s.fallbacks:
            parts.append(f"the same job fits a {other.name} ({gib(other.memory_bytes, 0)})")
            break
    for n in (2, 4, 8):
        if n <= gpu_count:
            continue
        s = solve(profile, gpu, fsdp_shards=n, **{**kwargs, "gpu_count": n})
        if s.recommended or s.fallbacks:
            parts.append(f"{n}x {gpu.name} with FSDP")
            break
    if len(parts) == 1:
        parts.append("no catalog GPU or GPU count up to 8 fits it")
    return parts[0] + ". What would fit: " + "; ".join(parts[1:]) + "."


LAST_V4 = "4.57"
"""The last transformers 4 release line: MoE experts as separate ``nn.Linear`` (fused 3-D tensors from 5.0)."""


def _v4_qlora(profile: ModelProfile, gpu: GPU, kwargs: dict, gpu_count: int = 1) -> str | None:
    """'QLoRA under transformers 4.x fits' when this MoE's experts, fused (and left unquantised by bitsandbytes)
    under transformers 5, are separate nn.Linear in the registry's 4.x layout and NF4 there makes the job fit
    (on the GPUs asked for: sharded with FSDP when there are several)."""
    from aegis.models.architectures import registry

    entry = registry.find(profile.model_type)
    if not profile.is_moe or profile.layout_major < 5 or entry is None or entry.moe is None or not entry.moe.v4_experts:
        return None
    stack = kwargs["stack"].model_copy(update={"transformers_version": LAST_V4})
    shards = {"fsdp_shards": gpu_count} if gpu_count > 1 else {}
    v4 = solve(profile_for_stack(profile, stack), gpu, **{**kwargs, "stack": stack}, **shards)
    if not (v4.recommended or v4.fallbacks):
        return None
    where = f" with FSDP over the {gpu_count} GPUs" if gpu_count > 1 else ""
    return (f"QLoRA under transformers {entry.transformers_since}-{LAST_V4}, whose separate expert nn.Linear "
            f"bitsandbytes quantises to NF4{where} (--transformers {LAST_V4})")


def _counterfactual(profile, rec: Tier, gpu: GPU, epoch_tokens, epochs: float, kwargs: dict) -> list:
    """For a local GPU: what the run would cost on the cheapest cloud GPUs that fit it."""
    out = []
    candidates = sorted((g for g in hardware.list_gpus() if not g.local and g.prices),
                        key=lambda g: g.prices[0].usd_per_hour)
    picked = 0
    for other in candidates:
        if estimate(profile, rec.config, gpu=other).high_bytes > other.memory_bytes:
            continue
        lo, hi, _, _ = tokens_per_s_range(profile, rec.config, other)
        hours = (epoch_tokens[0] / hi / 3600 * epochs, epoch_tokens[1] / lo / 3600 * epochs)
        out += [c.model_copy(update={"counterfactual": True}) for c in costs(other, 1, hours)[:1]]
        picked += 1
        if picked == 2:
            break
    return out

