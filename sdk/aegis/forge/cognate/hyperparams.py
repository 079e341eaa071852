"""The Cognate architecture's hyper-parameters (:class:`CognateConfig`) and the seed's defaults.

    cfg = CognateConfig()                          # ~25M parameters: 8 layers, 512 hidden, 8 heads, LTM 2048
    cfg = CognateConfig(**TINY_MODEL, vocab_size=512)   # the CPU-sized model `aegis cognate --tiny` trains
    cfg.num_parameters()                           # counted from the shapes, no JAX needed

The same fields are written to the exported ``config.json`` (``model_type: cognate``) and read back by the torch
modeling code shipped with every export (``hf/configuration_cognate.py``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["CognateConfig", "TINY_MODEL", "param_shapes"]


class CognateConfig(BaseModel):
    """A Cognate model: Titans-MAG layers (sliding-window attention over persistent tokens + the input, a neural
    long-term memory, the MAG gate) inside a recursive-reasoning loop with an ACT halting head."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vocab_size: int = Field(8192, ge=2, le=1_000_000, description="Tokenizer vocabulary (embedding rows, tied head).")
    hidden_size: int = Field(512, ge=4, le=65536, description="Width of the residual stream.")
    num_layers: int = Field(8, ge=1, le=256, description="Titans-MAG layers in the backbone.")
    num_heads: int = Field(8, ge=1, le=256, description="Attention heads (hidden_size must divide by it).")
    intermediate_size: int = Field(768, ge=1, le=1_000_000, description="SwiGLU feed-forward width.")
    num_persistent: int = Field(16, ge=0, le=4096, description="Persistent memory tokens prepended to the input.")
    window: int = Field(256, ge=1, le=1_000_000, description="Sliding-window attention span (input tokens).")
    memory_dim: int = Field(64, ge=1, le=65536, description="Key/value width of the neural long-term memory.")
    ltm_slots: int = Field(2048, ge=1, le=65536,
                           description="Long-term memory slots: hidden units of the memory MLP (the seed: 2048-8192).")
    memory_chunk: int = Field(16, ge=1, le=65536,
                              description="Tokens per memory update (momentum and forgetting shared in a chunk).")
    memory_max_lr: float = Field(0.01, gt=0, le=10.0,
                                 description="Largest inner learning rate theta_t (titans-pytorch: 1e-2).")
    max_passes: int = Field(3, ge=1, le=16, description="Recursive-reasoning passes (the seed: up to 3).")
    act_threshold: float = Field(0.95, gt=0, le=1.0, description="ACT halts once the summed halting prob. reaches it.")
    ponder_weight: float = Field(0.01, ge=0, le=10.0, description="Weight of the ponder cost N + R in the loss.")
    deep_supervision: float = Field(0.5, ge=0, le=10.0, description="Weight of every pass's own LM loss.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base.")
    rms_norm_eps: float = Field(1e-6, gt=0, lt=1, description="RMSNorm epsilon.")
    max_position_embeddings: int = Field(2048, ge=1, description="Longest sequence the model is meant for.")
    initializer_range: float = Field(0.02, gt=0, le=1, description="Std of the normal initialisation.")

    @model_validator(mode="after")
    def _heads_divide(self) -> CognateConfig:
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"hidden_size {self.hidden_size} must split into {self.num_heads} heads of even width")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def num_parameters(self) -> int:
        """Parameters, counted from :func:`param_shapes`."""
        import math

        return sum(math.prod(s) for s in param_shapes(self).values())


TINY_MODEL: dict = {
    "hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128, "num_persistent": 4,
    "window": 32, "memory_dim": 16, "memory_chunk": 8, "max_position_embeddings": 256,
}
"""The CPU-sized architecture `aegis cognate --tiny` trains (LTM slots stay the seed's 2048 / 8192)."""


def param_shapes(cfg: CognateConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, by its name in the exported safetensors (torch layout: a linear is (out, in))."""
    d, m, s, i = cfg.hidden_size, cfg.memory_dim, cfg.ltm_slots, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, d)}
    if cfg.num_persistent:
        shapes["model.persistent"] = (cfg.num_persistent, d)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "attn_norm.weight": (d,), p + "q_proj.weight": (d, d), p + "k_proj.weight": (d, d),
            p + "v_proj.weight": (d, d), p + "o_proj.weight": (d, d),
            p + "memory.q_proj.weight": (m, d), p + "memory.k_proj.weight": (m, d), p + "memory.v_proj.weight": (m, d),
            p + "memory.o_proj.weight": (d, m), p + "memory.w1": (m, s), p + "memory.w2": (s, m),
            p + "memory.lr_proj.weight": (1, d), p + "memory.lr_proj.bias": (1,),
            p + "memory.momentum_proj.weight": (1, d), p + "memory.momentum_proj.bias": (1,),
            p + "memory.decay_proj.weight": (1, d), p + "memory.decay_proj.bias": (1,),
            p + "gate.attn_norm.weight": (d,), p + "gate.mem_norm.weight": (d,),
            p + "gate.attn_weight": (d,), p + "gate.mem_weight": (d,), p + "gate.bias": (d,),
            p + "mlp_norm.weight": (d,), p + "gate_proj.weight": (i, d), p + "up_proj.weight": (i, d),
            p + "down_proj.weight": (d, i),
        })
    shapes.update({
        "model.latent_norm.weight": (d,), "model.y_proj.weight": (d, d),
        "model.norm.weight": (d,), "model.halt_proj.weight": (1, d), "model.halt_proj.bias": (1,),
    })
    return shapes
