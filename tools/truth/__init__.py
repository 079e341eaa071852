"""Memory ground truth: trace the peak tensor memory of real training steps.

`trace.py` builds a transformers model from a config (random weights; under
`FakeTensorMode` no real memory is used), runs two HF-Trainer-like training steps
(forward, the model's own `labels=` loss, backward, gradient clipping, AdamW step,
`zero_grad(set_to_none=True)`) and records the peak of live tensor-storage bytes
(rounded to 512 B like the CUDA caching allocator) per phase and by category.

    python -m tools.truth.build --only llama-3.1-8b      # regenerate rows
    python -m tools.truth.show                           # print the table
    python -m tools.truth.explain meta-llama/Llama-3.2-1B --method lora -b 2 -s 1024
                                                         # what is live at the peak, by op

Stack profiles: a setup also says which trainer's model preparation it imitates (`trainer`:
hf / trl / peft), whether `prepare_model_for_kbit_training` runs (`kbit_prep`), the
checkpointing variant (`checkpointing`), the LoRA dropout, and the transformers version it
must run under (`transformers`). Rows record `transformers_version`, `kbit_prep`,
`lora_dropout`, `checkpointing` and `trainer`.

One venv per transformers version. A grid row pinned to a version the main environment does
not have is traced by `build` with `/work/venvs/tf<major>/bin/python` (root overridable with
`$AEGIS_TRUTH_VENVS`, or `--python 4.48.1=/path/to/python`), with PYTHONPATH=sdk:. so
`tools.truth` and `aegis.models.catalog` import from this checkout. The transformers 4 venv was made with:

    python -m venv /work/venvs/tf4
    /work/venvs/tf4/bin/pip install torch==2.13.0 transformers==4.48.1 peft==0.14.0 \
        accelerate==1.3.0 bitsandbytes==0.50.2 pydantic

torch 2.13.0+cpu is the main environment's wheel (pip's find-links); transformers 4.48.1 runs
with it. peft 0.14.0 and accelerate 1.3.0 are the releases of transformers 4.48's time.
bitsandbytes is the main environment's 0.50.2, not a 0.45 of that time: the trace quantises
with `quantize_4bit` on fake CPU tensors, which needs its torch-op backend; the NF4 storage it
produces (packed uint8 weight, uint8 absmax with nested fp32 absmax, codes, offset) is what the
frozen-weight bytes count. TRL is not installed: its SFTTrainer preparation is imitated
(`model.peft_module_casting_to_bf16`, copied from trl 0.14).

    PYTHONPATH=sdk:. /work/venvs/tf4/bin/python -m tools.truth.build --row MODEL_ID SETUP_JSON   # one row
    python -m tools.truth.build --model Mixtral                    # builds pick the venv per row
"""
