"""Sanity checks on a plan: memory headroom, eval spikes, training dynamics, large vocabularies, MoE.

    risks, notes = risks_and_notes(report, profile)
"""

from __future__ import annotations

from aegis.schema import LoRAConfig, ModelProfile, PlanReport, Risk, lora_selects, lora_target_names
from aegis.planning.solver import comfort_bytes
from aegis.units import gib

__all__ = ["risks_and_notes"]

def risks_and_notes(report: PlanReport, profile: ModelProfile) -> tuple[list[Risk], list[str]]:
    risks: list[Risk] = []
    notes: list[str] = []
    rec, gpu = report.recommended, report.gpu
    if rec is None:
        risks.append(Risk(level="danger", title="VRAM",
                          detail="nothing fits this GPU as asked: 'Nothing fits' above says what would"))
    else:
        room = rec.headroom_bytes
        if room >= comfort_bytes(gpu):
            risks.append(Risk(level="ok", title="VRAM", detail=f"{gib(room)} headroom at the predicted high end -- no OOM expected"))
        else:
            risks.append(Risk(level="warn", title="VRAM", detail=f"only {gib(room)} headroom: use a fallback if it OOMs"))
        eval_peak = rec.memory.eval_peak_bytes
        eval_len = report.dataset.tokens.max if report.dataset else rec.config.seq_len
        if eval_peak > gpu.memory_bytes:
            risks.append(Risk(level="warn", title="Eval spike", detail=(
                f"eval at max length ({eval_len:,}) with micro batch {rec.config.micro_batch_size} -> ~{gib(eval_peak)} "
                f"(KV cache + logits) > {gib(gpu.memory_bytes)}: set per_device_eval_batch_size=1, "
                "eval_accumulation_steps=4, or cap eval length")))
        else:
            risks.append(Risk(level="ok", title="Eval spike", detail=f"eval at {eval_len:,} tokens peaks at ~{gib(eval_peak)} -- fits"))
        if not gpu.bf16_native and rec.config.precision in ("bf16", "bf16_mixed"):
            fp16 = gpu.tflops("fp16_mixed")
            risks.append(Risk(level="warn", title="Precision", detail=(
                f"{gpu.name} has no bf16 tensor cores (compute capability {gpu.compute_capability}): bf16 runs emulated "
                f"at ~{gpu.bf16_tflops:g} TFLOPS" + (f", fp16 mixed precision at {fp16:g}: say 'fp16'" if fp16 > gpu.bf16_tflops
                                                       else ""))))
        logits = next((c for c in rec.memory.components if c.key == "logits"), None)
        # worth a warning when it is a large share of the peak and more than the estimate's own +/- margin: a
        # buffer inside that margin (a tiny vocabulary's few MiB) changes no prediction and no decision
        if (logits is not None and logits.bytes > 0.25 * rec.memory.tensor_bytes
                and logits.bytes > rec.memory.dynamic_margin_bytes and not rec.config.chunked_cross_entropy):
            risks.append(Risk(level="warn", title="Logits buffer", detail=(
                f"{gib(logits.bytes)} ({logits.bytes / rec.memory.tensor_bytes:.0%} of the peak) for the "
                f"{profile.vocab_size:,}-token vocabulary: chunked cross-entropy (Liger, Unsloth) removes most of it")))
    ds = report.dataset
    eff = rec.config.effective_batch_size * report.gpu_count if rec else None
    if ds is not None and eff:
        steps = report.steps_per_epoch or 0
        if ds.num_rows < 1000 and report.epochs >= 3:
            risks.append(Risk(level="warn", title="Overfitting", detail=(
                f"{ds.num_rows:,} rows x {report.epochs:g} epochs: each sample seen {report.epochs:g} times on a small set; "
                "watch eval loss, consider 1-2 epochs")))
        elif steps < 20:
            risks.append(Risk(level="warn", title="Training dynamics", detail=(
                f"only {steps} optimizer steps per epoch at effective batch {eff}: lower the batch or add data")))
        else:
            risks.append(Risk(level="ok", title="Training dynamics", detail=(
                f"effective batch {eff} gives {steps:,} steps/epoch over {ds.num_rows:,} rows -- reasonable")))
        if ds.truncated_share > 0.05:
            risks.append(Risk(level="warn", title="Truncation", detail=(
                f"{ds.truncated_share:.0%} of rows exceed seq {ds.seq_len:,} and will be cut: raise seq or filter them")))
        if not ds.tokenizer_exact:
            notes.append(f"token counts from {ds.tokenizer}; a local model folder or a cached tokenizer gives "
                         "exact counts")
    if profile.is_moe:
        notes.append(
            f"MoE: all {profile.total_params / 1e9:.1f}B parameters ({profile.num_experts} experts/layer) are held in memory, "
            f"but each token uses only {profile.active_params_per_token / 1e9:.1f}B (top-{profile.num_experts_per_tok}); "
            "compute follows the active count, memory the total"
        )
        # the layout the profile was built for (`Family.layers_for`): separate per-expert nn.Linear only where the
        # registry gives the family a transformers 4 layout and the stack runs transformers 4
        separate = any(m.name.startswith("experts.") and m.quantizable for m in profile.linear_modules)
        if report.method != "full" and separate:
            notes.append(f"transformers {report.stack.transformers_version} keeps each expert as separate nn.Linear "
                         "modules: " + ("bitsandbytes quantises them to NF4; " if report.method == "qlora" else "")
                         + "LoRA adapts them (rank r each) when their names are targeted")
        elif report.method != "full":
            targets = lora_target_names((report.lora or LoRAConfig()).target_modules, profile.linear_modules)
            experts = [m for m in profile.linear_modules if m.name.startswith("experts.") and m.lora_targetable]
            wrapped = any(lora_selects(m, targets) for m in experts)
            names = ",".join(n for m in experts for n in m.matched_by)
            notes.append(f"transformers {report.stack.transformers_version} stores experts as fused 3-D tensors: "
                         "bitsandbytes leaves them unquantized under QLoRA; "
                         + ("PEFT wraps them with per-expert adapters (rank 2r on gate_up)" if wrapped
                            else "LoRA target names reach attention (and shared experts), not the routed experts"
                            + (f"; target {names} (or all-linear) to adapt them too" if experts else "")))
    # QLoRA's k-bit preparation (fp32 or bf16 embeddings, head and norms) is stated on the report's Stack line
    return risks, notes
