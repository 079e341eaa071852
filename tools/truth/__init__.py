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
"""
