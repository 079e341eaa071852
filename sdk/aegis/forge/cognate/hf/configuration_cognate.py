"""Configuration of a Cognate model (TRM x Titans-MAG), written by Aegis (`aegis cognate`).

Loaded by transformers with ``trust_remote_code=True``: ``AutoConfig.from_pretrained(folder, trust_remote_code=True)``.
The fields are Aegis's ``aegis.forge.cognate.CognateConfig``.
"""

from transformers import PretrainedConfig


class CognateConfig(PretrainedConfig):
    model_type = "cognate"

    def __init__(self, vocab_size=8192, hidden_size=512, num_layers=8, num_heads=8, intermediate_size=768,
                 num_persistent=16, window=256, memory_dim=64, ltm_slots=2048, memory_chunk=16, memory_max_lr=0.01,
                 max_passes=3, act_threshold=0.95, ponder_weight=0.01, deep_supervision=0.5, rope_theta=10000.0,
                 rms_norm_eps=1e-6, max_position_embeddings=2048, initializer_range=0.02, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.num_hidden_layers = num_layers
        self.num_heads = num_heads
        self.num_attention_heads = num_heads
        self.intermediate_size = intermediate_size
        self.num_persistent = num_persistent
        self.window = window
        self.memory_dim = memory_dim
        self.ltm_slots = ltm_slots
        self.memory_chunk = memory_chunk
        self.memory_max_lr = memory_max_lr
        self.max_passes = max_passes
        self.act_threshold = act_threshold
        self.ponder_weight = ponder_weight
        self.deep_supervision = deep_supervision
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        kwargs.setdefault("tie_word_embeddings", False)  # the head reads the embedding matrix itself
        super().__init__(**kwargs)
