"""Architecture facts shared by the planner (`aegis.models.families`) and the JAX engine (`aegis.train.modeling`).

Today this holds the config.json readers with transformers' defaults (:mod:`aegis.models.architectures.config_keys`):
what a key means when config.json leaves it out, and what each ``Config.__post_init__`` derives from it
(layer types, effective sliding window, MoE layout). Both the planner's families and the engine's specs
read a config through these, so the two cannot disagree on a default.

    from aegis.models.architectures import config_keys as arch
    arch.head_dim(cfg), arch.layer_windows(cfg), arch.num_experts(cfg)
"""

from aegis.models.architectures import config_keys as config

__all__ = ["config"]
