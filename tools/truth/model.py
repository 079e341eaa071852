"""Build a transformers causal LM from a config, prepared for one `TraceSetup`.

Everything runs in whatever tensor mode is active: inside `FakeTensorMode` the model is
fake (no real memory, any size); outside it is a real CPU model (used to validate).

- full: `AutoModelForCausalLM.from_config(dtype=bf16 | fp32)`.
- lora: bf16 base, `get_peft_model(LoraConfig(r, alpha, targets))` with PEFT's default
  `autocast_adapter_dtype=True` (adapters in fp32).
- qlora: bf16 base; every `nn.Linear` that transformers' bitsandbytes quantizer would
  convert (`replace_with_bnb_linear` with the quantizer's own skip list: lm_head, and
  `_keep_in_fp32_modules`) becomes a `bnb.nn.Linear4bit` whose weight is produced by
  `bitsandbytes.functional.quantize_4bit(nf4, blocksize 64, double quant)` — the same call
  `Params4bit` makes on load — installed as a frozen uint8 parameter carrying its
  `quant_state` (`Params4bit` itself cannot wrap a fake tensor). Then
  `prepare_model_for_kbit_training` (it upcasts every remaining bf16 parameter to fp32)
  and `get_peft_model`.
- gradient checkpointing: `gradient_checkpointing_enable({"use_reentrant": False | True})`
  (`setup.checkpointing`), which in transformers 5 also calls `enable_input_require_grads()`
  (transformers 4 does not). With reentrant checkpointing an adapter run needs inputs that
  require grad (else no gradient reaches the adapters inside checkpointed layers), so the
  trace calls `enable_input_require_grads()` there as TRL and PEFT's k-bit preparation do.
- `kbit_prep=False` (QLoRA): no `prepare_model_for_kbit_training`; the non-quantised weights
  stay bf16 (a plain PEFT loop).
- `trainer="trl"`: TRL SFTTrainer's own preparation (trl 0.14 `SFTTrainer.__init__`): after
  `get_peft_model` on a 4-bit model with bf16, `peft_module_casting_to_bf16` puts modules
  whose name holds "norm" in fp32 and `embed_tokens` / `lm_head` back in bf16.
- transformers 4 (e.g. 4.48.1, in its own venv): `torch_dtype=` instead of `dtype=`, the
  quantizer's skip list from `get_keys_to_not_convert`, MoE experts are separate `nn.Linear`
  modules (quantised for QLoRA) routed by a per-expert loop (see `patches.balanced_routing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tools.truth.setup import TraceSetup



def transformers_major() -> int:
    """The major version of the transformers the trace runs under."""
    import transformers

    return int(transformers.__version__.split(".")[0])


def gc_kwargs(setup: TraceSetup) -> dict[str, bool]:
    """`gradient_checkpointing_kwargs` for the setup's checkpointing variant."""
    return {"use_reentrant": setup.checkpointing == "reentrant"}


@dataclass
class PreparedModel:
    """A model ready to train plus facts about how it was prepared."""

    model: torch.nn.Module
    upcast_to_fp32: list[str] = field(default_factory=list)
    quantized_modules: int = 0
    extra_tensors: list[torch.Tensor] = field(default_factory=list)


def load_config(config: dict[str, Any] | str) -> Any:
    """A transformers config from a config.json dict or path."""
    import json

    from transformers import AutoConfig

    if isinstance(config, str):
        with open(config, encoding="utf-8") as fh:
            config = json.load(fh)
    data = dict(config)
    model_type = data.pop("model_type")
    for key in ("architectures", "transformers_version", "_name_or_path"):
        data.pop(key, None)
    return AutoConfig.for_model(model_type, **data)


def _suffix(name: str) -> str:
    parts = [p for p in name.split(".") if not p.isdigit()]
    return ".".join(parts[-2:])


def _quantize_linear4bit(model: torch.nn.Module) -> tuple[int, list[torch.Tensor]]:
    """Replace nn.Linear layers as transformers' bnb quantizer does, with NF4 weights."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    qconfig = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    skip = _modules_to_not_convert(model)
    from transformers.pytorch_utils import Conv1D

    # transformers quantises nn.Linear and GPT-2's Conv1D ([in, out], transposed to [out, in] before quantising)
    old = {name: mod for name, mod in model.named_modules() if type(mod) is torch.nn.Linear or isinstance(mod, Conv1D)}
    from torch.utils._python_dispatch import _disable_current_modes

    # The replacement modules are built on the meta device; Params4bit cannot wrap a
    # FakeTensor, so build them with the tensor modes switched off, then install weights.
    with _disable_current_modes():
        # bitsandbytes caches its 256-entry dynamic map on first use (built with .tolist(),
        # which a fake tensor cannot answer); build that 1 KiB constant outside the modes.
        if "dynamic" not in bnbf.name2qmap:
            bnbf.name2qmap["dynamic"] = bnbf.create_dynamic_map()
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qconfig)
    count = 0
    quant_tensors: list[torch.Tensor] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, bnb.nn.Linear4bit):
            continue
        src = old[name]
        weight = src.weight.detach().to(torch.bfloat16)
        if isinstance(src, Conv1D):
            weight = weight.t().contiguous()
        packed, state = bnbf.quantize_4bit(
            weight, blocksize=64, compress_statistics=True, quant_type="nf4", quant_storage=torch.uint8
        )
        del weight
        param = torch.nn.Parameter(packed, requires_grad=False)
        param.quant_state = state
        param.blocksize = 64
        param.quant_type = "nf4"
        param.compress_statistics = True
        param.bnb_quantized = True
        mod.weight = param
        mod.quant_state = state
        if src.bias is not None:
            mod.bias = torch.nn.Parameter(src.bias.detach().to(torch.bfloat16), requires_grad=False)
        quant_tensors.extend(_quant_state_tensors(state))
        count += 1
    old.clear()
    model.is_loaded_in_4bit = True
    return count, quant_tensors


def _modules_to_not_convert(model: torch.nn.Module) -> list[str]:
    """The bnb quantizer's skip list: lm_head (or tied / last modules) plus `_keep_in_fp32_modules`."""
    keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
    if transformers_major() >= 5:
        from transformers.quantizers.base import HfQuantizer

        return HfQuantizer.get_modules_to_not_convert(model, None, keep or None)
    from transformers.integrations.bitsandbytes import get_keys_to_not_convert

    return list(get_keys_to_not_convert(model)) + keep  # as Bnb4BitHfQuantizer (4.48) builds it


def peft_module_casting_to_bf16(model: torch.nn.Module) -> None:
    """TRL's `trl.trainer.utils.peft_module_casting_to_bf16` (trl 0.14), which SFTTrainer runs on a
    4-bit PEFT model when bf16=True. Copied so the trace needs no trl install."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm) or "norm" in name:
            module = module.to(torch.float32)
        elif any(x in name for x in ["lm_head", "embed_tokens", "wte", "wpe"]):
            if hasattr(module, "weight"):
                if module.weight.dtype == torch.float32:
                    module = module.to(torch.bfloat16)


def _quant_state_tensors(state: Any) -> list[torch.Tensor]:
    out = [t for t in (state.absmax, state.code, state.offset) if isinstance(t, torch.Tensor)]
    if state.state2 is not None:
        out.extend(t for t in (state.state2.absmax, state.state2.code) if isinstance(t, torch.Tensor))
    return out


def build_model(config: dict[str, Any] | str, setup: TraceSetup) -> PreparedModel:
    """Construct and prepare the model for ``setup`` in the current tensor mode."""
    from transformers import AutoModelForCausalLM

    hf_config = load_config(config)
    hf_config.use_cache = False
    full_fp32 = setup.method == "full" and setup.precision in ("bf16_mixed", "fp32")
    dtype = torch.float32 if full_fp32 or setup.precision == "fp32" else torch.bfloat16
    dtype_kw = "dtype" if transformers_major() >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=setup.attention, **{dtype_kw: dtype})
    model.train()
    prepared = PreparedModel(model=model)
    before: dict[int, torch.dtype] = {}
    names: dict[int, str] = {}

    if setup.method == "qlora":
        prepared.quantized_modules, prepared.extra_tensors = _quantize_linear4bit(model)
        before = {id(p): p.dtype for p in model.parameters()}
        names = {id(p): n for n, p in model.named_parameters()}
        if setup.kbit_prep:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(
                model,
                use_gradient_checkpointing=setup.gradient_checkpointing,
                gradient_checkpointing_kwargs=gc_kwargs(setup),
            )
        elif setup.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs(setup))
    elif setup.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs(setup))
    if setup.method != "full" and setup.gradient_checkpointing and setup.checkpointing == "reentrant":
        model.enable_input_require_grads()

    if setup.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=setup.lora_rank,
            lora_alpha=setup.lora_alpha,
            target_modules=list(setup.lora_targets),
            lora_dropout=setup.lora_dropout,
            bias="none",
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
        model.train()
        if setup.trainer == "trl" and setup.method == "qlora":
            peft_module_casting_to_bf16(model)
    if setup.method == "qlora":
        prepared.upcast_to_fp32 = sorted(
            {_suffix(names[id(p)]) for p in model.parameters()
             if id(p) in before and before[id(p)] != torch.float32 and p.dtype == torch.float32}
        )
    prepared.model = model
    return prepared


def lora_summary(model: torch.nn.Module) -> tuple[int, int, list[str]]:
    """(LoRA parameter elements, wrapped module count, wrapped module suffixes)."""
    params = sum(p.numel() for n, p in model.named_parameters() if "lora_A" in n or "lora_B" in n)
    wrapped = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and len(getattr(m, "lora_A", {})) > 0]
    suffixes = sorted({n.split(".")[-1] for n in wrapped})
    return params, len(wrapped), suffixes
