"""Architecture facts shared by the planner (`aegis.families`) and the JAX engine (`aegis.train.models`).

Today this holds the config.json readers with transformers' defaults (:mod:`aegis.architectures.config`):
what a key means when config.json leaves it out, and what each ``Config.__post_init__`` derives from it
(layer types, effective sliding window, MoE layout). Both the planner's families and the engine's specs
read a config through these, so the two cannot disagree on a default.

    from aegis.architectures import config as arch
    arch.head_dim(cfg), arch.layer_windows(cfg), arch.num_experts(cfg)
"""

from aegis.architectures import config

__all__ = ["config"]
