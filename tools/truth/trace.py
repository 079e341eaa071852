"""Trace the peak tensor memory of HF-Trainer-style training steps.

    from tools.truth.trace import trace_training
    from tools.truth.setup import TraceSetup
    result = trace_training(config_dict, TraceSetup(method="lora", micro_batch_size=4, seq_len=1024))

Each step is what `Trainer.training_step` + the optimizer loop do with default arguments:
forward with `labels=` (the model's own loss: logits upcast to fp32, cross-entropy),
`loss.backward()`, `clip_grad_norm_(max_norm=1.0, foreach=True)`, `AdamW.step()`
(lr 5e-5, weight decay 0.0, two param groups as `Trainer.create_optimizer` builds them,
foreach=True as on CUDA, or fused=True), `zero_grad(set_to_none=True)`. Two steps, so the
second runs with optimizer state allocated. `bf16_mixed` (and `autocast=True`) runs forward
and loss under `torch.autocast("cpu", dtype=torch.bfloat16)` (HF's `bf16=True`).

`fake=True` (default) runs everything under `FakeTensorMode` on a fake CPU device: no real
memory is used and an 8B model traces in seconds. `fake=False` runs the same code on real
CPU tensors; the test suite checks both give the same peak on small models.

The model's preparation follows `setup.trainer` / `kbit_prep` / `checkpointing` /
`lora_dropout` (see tools/truth/model.py); the step loop is the same for every trainer. A row
pinned to a transformers version (`setup.transformers`) is refused under another one.
Dropout runs as on CUDA (`patches.cuda_dropout`: `native_dropout` with a bool mask).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from tools.truth.alloc import LiveBytes, rounded_bytes
from tools.truth.model import build_model, lora_summary
from tools.truth.patches import (
    balanced_routing, cuda_dropout, fp32_grouped_mm, settable_fake_params, static_rope_length, unpadded_inputs,
)
from tools.truth.setup import TraceResult, TraceSetup

PHASES = ("forward", "backward", "clip", "optimizer")
HF_LR = 5e-5
HF_WEIGHT_DECAY = 0.0


def _param_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    """The two groups `Trainer.create_optimizer` builds (decay / no decay)."""
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if n in decay], "weight_decay": HF_WEIGHT_DECAY},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]


def _storage_keys(tensors) -> set[int]:
    return {t.untyped_storage()._cdata for t in tensors if isinstance(t, torch.Tensor)}


def _sum_storage(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st._cdata] = rounded_bytes(st.nbytes())
    return sum(seen.values())


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _run(
    config: dict[str, Any] | str, setup: TraceSetup, record_origin: bool = False, on_setup: Any = None
) -> tuple[TraceResult, LiveBytes]:
    """The traced steps on the default device (the fake or real CPU, or a GPU for `tools.truth.cuda`);
    ``on_setup()`` runs once the model and optimizer are built, where the step peaks start."""
    start = time.perf_counter()
    holder: dict[str, Any] = {}

    def groups() -> dict[str, set[int]]:
        model = holder.get("model")
        if model is None:
            return {}
        params = list(model.parameters())
        out = {
            "params": _storage_keys(params) | _storage_keys(holder.get("extra", [])),
            "grads": _storage_keys(p.grad for p in params if p.grad is not None),
        }
        opt = holder.get("optimizer")
        out["optimizer_state"] = _storage_keys(_state_tensors(opt)) if opt is not None else set()
        return out

    tracker = LiveBytes(groups_fn=groups, record_origin=record_origin)
    with tracker:
        prepared = build_model(config, setup)
        model = prepared.model
        holder["model"] = model
        holder["extra"] = prepared.extra_tensors
        vocab = model.get_input_embeddings().num_embeddings
        shape = (setup.micro_batch_size, setup.seq_len)
        input_ids = torch.randint(0, vocab, shape, dtype=torch.long)
        batch = {
            "input_ids": input_ids,
            "attention_mask": torch.ones(shape, dtype=torch.long),
            "labels": input_ids.clone(),
        }
        fused = setup.optimizer == "adamw_fused"
        optimizer = torch.optim.AdamW(
            _param_groups(model), lr=HF_LR, foreach=None if fused else True, fused=True if fused else None
        )
        holder["optimizer"] = optimizer
        trainable = [p for p in model.parameters() if p.requires_grad]
        after_setup = tracker.total_bytes
        tracker.reset_peak()
        if on_setup is not None:
            on_setup()

        autocast = (
            torch.autocast(input_ids.device.type, dtype=torch.bfloat16)
            if setup.autocast or (setup.method == "full" and setup.precision == "bf16_mixed")
            else contextlib.nullcontext()
        )
        step_of_peak = 1
        phase_peaks: dict[str, int] = {}
        loss_dtype = ""
        grad_bytes = 0
        for step in range(1, setup.steps + 1):
            before = tracker.peak_bytes
            tracker.phase_peaks = {}
            tracker.phase("forward")
            with autocast:
                loss = model(**batch).loss
            loss_dtype = str(loss.dtype).replace("torch.", "")
            tracker.phase("backward")
            loss.backward()
            del loss
            grad_bytes = _sum_storage(p.grad for p in trainable if p.grad is not None)
            if setup.max_grad_norm is not None:
                tracker.phase("clip")
                torch.nn.utils.clip_grad_norm_(trainable, setup.max_grad_norm, foreach=True)
            tracker.phase("optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tracker.phase("idle")
            if tracker.peak_bytes > before:
                step_of_peak = step
            for name, value in tracker.phase_peaks.items():
                if name in PHASES:
                    phase_peaks[name] = max(phase_peaks.get(name, 0), value)
        breakdown = tracker.peak_breakdown()

        params = list(model.parameters())
        lora_params, lora_modules, lora_wrapped = lora_summary(model)
        result = TraceResult(
            peak_bytes=tracker.peak_bytes,
            peak_phase=tracker.peak_phase,
            peak_step=step_of_peak,
            phase_peak_bytes=phase_peaks,
            peak_breakdown_bytes=breakdown,
            param_bytes_frozen=_sum_storage([p for p in params if not p.requires_grad] + prepared.extra_tensors),
            param_bytes_trainable=_sum_storage(p for p in params if p.requires_grad),
            buffer_bytes=_sum_storage(model.buffers()),
            grad_bytes=grad_bytes,
            optimizer_state_bytes=_sum_storage(_state_tensors(optimizer)),
            after_setup_bytes=after_setup,
            param_count_total=sum(p.numel() * (2 if p.dtype == torch.uint8 else 1) for p in params),
            param_count_trainable=sum(p.numel() for p in params if p.requires_grad),
            lora_param_count=lora_params,
            lora_module_count=lora_modules,
            lora_wrapped=lora_wrapped,
            upcast_to_fp32=prepared.upcast_to_fp32,
            quantized_modules=prepared.quantized_modules,
            loss_dtype=loss_dtype,
            transformers_version=_transformers_version(),
            seconds=round(time.perf_counter() - start, 2),
        )
        holder.clear()
    return result, tracker


def _import_outside_modes(config: dict[str, Any] | str) -> None:
    """Import everything the trace touches before any tensor mode is active.

    Modules create tensors at import time (bitsandbytes' NF4 tables, PEFT defaults); created
    inside the tracker they would be counted, and inside fake mode they would stay fake.
    """
    import bitsandbytes  # noqa: F401
    import bitsandbytes.backends.utils  # noqa: F401
    import peft  # noqa: F401
    import peft.tuners.lora.bnb  # noqa: F401
    from transformers import AutoModelForCausalLM, Trainer  # noqa: F401

    from tools.truth.model import load_config

    AutoModelForCausalLM._model_mapping[type(load_config(config))]


def trace_training(config: dict[str, Any] | str, setup: TraceSetup, *, fake: bool = True) -> TraceResult:
    """Trace ``setup`` on a model built from ``config`` (a config.json dict or path).

    ``fake=True`` uses `FakeTensorMode` (no real memory); ``fake=False`` runs for real on CPU.
    """
    return trace_with_tracker(config, setup, fake=fake)[0]


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _moe_routing(config: dict[str, Any] | str):
    """`balanced_routing` (its modeling module and expert count) and `static_rope_length` for a transformers 4 model."""
    import transformers
    from transformers import AutoModelForCausalLM

    from tools.truth.model import load_config

    if int(transformers.__version__.split(".")[0]) >= 5:
        return contextlib.nullcontext()
    hf_config = load_config(config)
    experts = getattr(hf_config, "num_local_experts", None) or getattr(hf_config, "num_experts", None)
    model_cls = AutoModelForCausalLM._model_mapping[type(hf_config)]
    stack = contextlib.ExitStack()
    stack.enter_context(balanced_routing(model_cls.__module__, experts))
    stack.enter_context(static_rope_length(model_cls.__module__))
    return stack


def check_version(setup: TraceSetup) -> None:
    """Refuse to trace a row pinned to another transformers version than the one installed."""
    if setup.transformers and setup.transformers != _transformers_version():
        raise RuntimeError(
            f"this row must be traced under transformers {setup.transformers}, this interpreter has "
            f"{_transformers_version()}: run it with that venv's python (see tools/truth/__init__.py)"
        )


def trace_with_tracker(
    config: dict[str, Any] | str, setup: TraceSetup, *, fake: bool = True, record_origin: bool = False
) -> tuple[TraceResult, LiveBytes]:
    """`trace_training` that also returns the tracker (with the op that allocated each
    storage live at the peak in ``tracker.peak_origin`` when ``record_origin``)."""
    check_version(setup)
    _import_outside_modes(config)
    with unpadded_inputs(), cuda_dropout():
        if not fake:
            return _run(config, setup, record_origin)
        from torch._subclasses.fake_tensor import FakeTensorMode

        with settable_fake_params(), fp32_grouped_mm(), _moe_routing(config), FakeTensorMode(allow_non_fake_inputs=True):
            return _run(config, setup, record_origin)
