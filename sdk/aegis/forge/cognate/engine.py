"""A Cognate model behind the engine's model interface, so the forge's later phases (EvoMerge's fitness, Quiet-STaR)
run it like any model :func:`aegis.train.modeling.build_model` serves.

    if is_cognate(config):
        model = build_cognate(config)                 # .apply(params, ids) -> logits, .spec.num_layers, .config
        params = model.load(folder)                   # the engine's tree, read from the exported folder
        logits = model.apply(params, ids)             # the ACT mixture of the passes: forward(...)["logits"]
        h = model.hidden(params, ids)                 # model.project(h, model.head_weight(params)) == logits
    eval_peak_bytes(config, batch=8, seq_len=64)      # what one eval step holds (batch planning)
    flops_per_token(config, seq_len=64)               # forward FLOPs per token (EvoMerge's speed term)

A Cognate forward has no segment ids: its memory and attention would cross packed examples, so rows are evaluated
unpacked (one example per row, padded; padding only follows the tokens, and the model is causal).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aegis.forge.cognate.hyperparams import CognateConfig, param_shapes

__all__ = ["CognateModel", "CognateProfile", "CognateSpec", "build_cognate", "cognate_profile", "eval_peak_bytes",
           "flops_per_token", "is_cognate"]


def is_cognate(config: dict[str, Any]) -> bool:
    """Whether a config.json dict describes a Cognate model."""
    return isinstance(config, dict) and config.get("model_type") == "cognate"


def _cfg(config: dict[str, Any]) -> CognateConfig:
    return CognateConfig(**{k: v for k, v in config.items() if k in CognateConfig.model_fields})


@dataclass(frozen=True)
class CognateSpec:
    """The sizes callers of the engine's ``Model.spec`` read."""

    num_layers: int
    hidden_size: int
    vocab_size: int


class CognateModel:
    """:func:`aegis.forge.cognate.model.forward` with the engine model's surface (``apply``, ``spec``, ``config``)."""

    family = "cognate"

    def __init__(self, config: dict[str, Any]):
        import jax.numpy as jnp

        self.config = dict(config)
        self.cfg = _cfg(config)
        self.spec = CognateSpec(self.cfg.num_layers, self.cfg.hidden_size, self.cfg.vocab_size)
        self.dtype = self.param_dtype = jnp.dtype(jnp.float32)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return param_shapes(self.cfg)

    def init(self, rng: Any) -> dict[str, Any]:
        from aegis.forge.cognate.model import init_params

        return init_params(self.cfg, rng)

    def load(self, folder: str | Path) -> dict[str, Any]:
        """The parameters of the exported folder (its config must be this model's)."""
        from aegis.errors import CheckpointError
        from aegis.forge.cognate.hf_folder import load_pretrained

        params, cfg = load_pretrained(folder)
        if cfg != self.cfg:
            raise CheckpointError(f"{folder} holds a different Cognate config than this model's; build it from "
                                  "that folder's config.json")
        return params

    def apply(self, params: dict[str, Any], ids: Any, positions: Any = None, segment_ids: Any = None,
              **_: Any) -> Any:
        """Logits (B, T, V) of the ACT mixture. ``positions`` and ``segment_ids`` are accepted for the engine's
        call signature and not used: rows hold one example each (see the module docstring)."""
        from aegis.forge.cognate.model import forward

        return forward(params, self.cfg, ids)["logits"]

    def hidden(self, params: dict[str, Any], ids: Any, positions: Any = None, segment_ids: Any = None,
               **_: Any) -> Any:
        """(B, T, D) states whose projection by :meth:`head_weight` is :meth:`apply`'s logits: the ACT mixture of
        the passes' normalised answer latents."""
        from aegis.forge.cognate.model import forward

        return forward(params, self.cfg, ids)["hidden"]

    def head_weight(self, params: dict[str, Any]) -> Any:
        """The (V, D) output head: Cognate ties it to the embeddings."""
        return params["model.embed_tokens.weight"]

    def project(self, h: Any, w: Any) -> Any:
        """Logits ``h @ w^T``."""
        return h @ w.T

    def save(self, params: dict[str, Any], folder: str | Path, *, tokenizer: Any = None) -> None:
        """Write the parameters as an exported Cognate folder into ``folder`` (one its caller publishes)."""
        from aegis.forge.cognate.hf_folder import write_files

        write_files(Path(folder), params, self.cfg, tokenizer=tokenizer)

    def with_vocab(self, vocab_size: int) -> CognateModel:
        """The same model with ``vocab_size`` embedding rows (tokens added)."""
        return CognateModel({**self.config, "vocab_size": vocab_size})


def build_cognate(config: dict[str, Any]) -> CognateModel:
    """The :class:`CognateModel` of a Cognate config.json dict."""
    return CognateModel(config)


@dataclass(frozen=True)
class CognateProfile:
    """What BitNet's packing reads from a planner profile: decoder layers and parameters."""

    num_layers: int
    total_params: int


def cognate_profile(config: dict[str, Any]) -> CognateProfile:
    """Layers and parameter count of a Cognate config (counted from its shapes)."""
    cfg = _cfg(config)
    return CognateProfile(cfg.num_layers, cfg.num_parameters())


def eval_peak_bytes(config: dict[str, Any], *, batch: int, seq_len: int) -> int:
    """Bytes one jitted eval step of ``batch`` rows of ``seq_len`` tokens holds at its peak, counted from the
    forward's largest live tensors: the fp32 parameters, the passes' logits (K, B, T, V) with the log-softmax over
    the mixture, one layer's attention scores and probabilities (B, H, P+T, P+T), the memory scan's per-row weights,
    momenta and gradients (B x 6 x m x s) and a dozen (B, P+T, max(D, I)) activations."""
    cfg = _cfg(config)
    f32 = 4
    length = cfg.num_persistent + seq_len
    params = sum(_prod(s) for s in param_shapes(cfg).values())
    logits = (cfg.max_passes + 3) * batch * seq_len * cfg.vocab_size
    scores = 3 * batch * cfg.num_heads * length * length
    memory = 6 * batch * cfg.memory_dim * cfg.ltm_slots
    acts = 12 * batch * length * max(cfg.hidden_size, cfg.intermediate_size)
    return f32 * (params + logits + scores + memory + acts)


def flops_per_token(config: dict[str, Any], seq_len: int) -> float:
    """Forward FLOPs per token at ``seq_len``: per pass, 2 x the layers' matmul weights, the windowed attention
    (4 x D x visible keys), the memory's read and test-time update (a forward and its gradient through the
    m x s x 2 MLP: 6 x 2 m s), the halting and latent heads, and the tied output head (2 x D x V)."""
    cfg = _cfg(config)
    d, m, s, i = cfg.hidden_size, cfg.memory_dim, cfg.ltm_slots, cfg.intermediate_size
    visible = cfg.num_persistent + min(cfg.window, seq_len)
    per_layer = 2 * (4 * d * d + 3 * d * i + 4 * m * d) + 4 * d * visible + 6 * 2 * m * s
    per_pass = cfg.num_layers * per_layer + 2 * (d * d + d) + 2 * d * cfg.vocab_size
    return float(cfg.max_passes * per_pass)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n
