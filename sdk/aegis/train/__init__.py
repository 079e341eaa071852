"""Aegis' JAX training engine: model families, LoRA, NF4, safetensors I/O, data and train steps."""
