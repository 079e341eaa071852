"""Cognate (TRM x Titans-MAG) in PyTorch, written by Aegis (`aegis cognate`); the same equations as Aegis's JAX engine.

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    out = model(input_ids)            # out.logits, out.steps (ACT passes per token), out.ponder, out.memory_usage
    model.generate(input_ids, max_new_tokens=20)

One layer on x~ = [persistent tokens || x]: y = sliding-window attention (every position sees the persistent
tokens and the last ``window`` positions), m = the neural long-term memory's retrieval M_{n-1}(q_t), and the MAG gate
o = g * RMSNorm(y) + (1 - g) * RMSNorm(m), g = sigmoid(u_a * RMSNorm(y) + u_m * RMSNorm(m) + b). The memory is an MLP
M(x) = silu(x W1) W2 updated per chunk of tokens at test time by the gradient of sum_t theta_t ||M(k_t) - v_t||^2,
with momentum S_n = eta_n S_{n-1} - grad and forgetting M_n = (1 - alpha_n) M_{n-1} + S_n. Up to ``max_passes``
recursive passes (z = f(x + y + z), y = y + RMSNorm(z) W_y) are mixed by ACT halting (Graves, 2016). Generation
recomputes the whole prefix each step (the memory is re-derived from it); no key/value cache.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_cognate import CognateConfig


@dataclass
class CognateCausalLMOutput(CausalLMOutputWithPast):
    steps: Optional[torch.Tensor] = None
    ponder: Optional[torch.Tensor] = None
    memory_usage: Optional[torch.Tensor] = None


class CognateRMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _l2norm(x):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class CognateMemory(nn.Module):
    """Neural long-term memory: an MLP whose weights learn at test time (momentum + forgetting)."""

    def __init__(self, config):
        super().__init__()
        d, m, s = config.hidden_size, config.memory_dim, config.ltm_slots
        self.chunk, self.max_lr = config.memory_chunk, config.memory_max_lr
        self.q_proj = nn.Linear(d, m, bias=False)
        self.k_proj = nn.Linear(d, m, bias=False)
        self.v_proj = nn.Linear(d, m, bias=False)
        self.o_proj = nn.Linear(m, d, bias=False)
        self.w1 = nn.Parameter(torch.zeros(m, s))
        self.w2 = nn.Parameter(torch.zeros(s, m))
        self.lr_proj = nn.Linear(d, 1)
        self.momentum_proj = nn.Linear(d, 1)
        self.decay_proj = nn.Linear(d, 1)

    def forward(self, x):
        b, length, _ = x.shape
        c = self.chunk
        q = _l2norm(F.silu(self.q_proj(x)))
        k = _l2norm(F.silu(self.k_proj(x)))
        v = F.silu(self.v_proj(x))
        theta = self.max_lr * torch.sigmoid(self.lr_proj(x))[..., 0]
        w1 = self.w1.unsqueeze(0).expand(b, -1, -1)
        w2 = self.w2.unsqueeze(0).expand(b, -1, -1)
        s1, s2 = torch.zeros_like(w1), torch.zeros_like(w2)
        outs = []
        for start in range(0, length, c):
            sl = slice(start, min(start + c, length))
            qc, kc, vc, th, xc = q[:, sl], k[:, sl], v[:, sl], theta[:, sl], x[:, sl]
            outs.append(F.silu(qc @ w1) @ w2)  # retrieval from M_{n-1}
            mean = xc.mean(dim=1)
            eta = torch.sigmoid(self.momentum_proj(mean))[..., None]
            alpha = torch.sigmoid(self.decay_proj(mean))[..., None]
            h = kc @ w1
            a = F.silu(h)
            dp = 2.0 * th[..., None] * (a @ w2 - vc)
            g2 = a.transpose(1, 2) @ dp
            sig = torch.sigmoid(h)
            g1 = kc.transpose(1, 2) @ ((dp @ w2.transpose(1, 2)) * (sig * (1.0 + h * (1.0 - sig))))
            s1, s2 = eta * s1 - g1, eta * s2 - g2
            w1, w2 = (1.0 - alpha) * w1 + s1, (1.0 - alpha) * w2 + s2
        return self.o_proj(torch.cat(outs, dim=1))


class CognateGate(nn.Module):
    """MAG gate: o = g * y^ + (1 - g) * m^."""

    def __init__(self, config):
        super().__init__()
        d = config.hidden_size
        self.attn_norm = CognateRMSNorm(d, config.rms_norm_eps)
        self.mem_norm = CognateRMSNorm(d, config.rms_norm_eps)
        self.attn_weight = nn.Parameter(torch.ones(d))
        self.mem_weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, y, m):
        yn, mn = self.attn_norm(y), self.mem_norm(m)
        g = torch.sigmoid(yn * self.attn_weight + mn * self.mem_weight + self.bias)
        return g * yn + (1.0 - g) * mn, g


class CognateLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, i = config.hidden_size, config.intermediate_size
        self.num_heads, self.head_dim = config.num_heads, d // config.num_heads
        self.attn_norm = CognateRMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.memory = CognateMemory(config)
        self.gate = CognateGate(config)
        self.mlp_norm = CognateRMSNorm(d, config.rms_norm_eps)
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, h, cos, sin, mask):
        b, length, d = h.shape
        xn = self.attn_norm(h)
        q = self.q_proj(xn).view(b, length, self.num_heads, self.head_dim)
        k = self.k_proj(xn).view(b, length, self.num_heads, self.head_dim)
        v = self.v_proj(xn).view(b, length, self.num_heads, self.head_dim)
        q, k = _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / self.head_dim ** 0.5
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        att = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, length, d)
        o, g = self.gate(self.o_proj(att), self.memory(xn))
        h = h + o
        xn = self.mlp_norm(h)
        return h + self.down_proj(F.silu(self.gate_proj(xn)) * self.up_proj(xn)), g


class CognatePreTrainedModel(PreTrainedModel):
    config_class = CognateConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["CognateLayer"]

    def _init_weights(self, module):
        return  # weights always come from the checkpoint Aegis wrote


class CognateModel(CognatePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        if config.num_persistent:
            self.persistent = nn.Parameter(torch.zeros(config.num_persistent, d))
        self.layers = nn.ModuleList(CognateLayer(config) for _ in range(config.num_layers))
        self.latent_norm = CognateRMSNorm(d, config.rms_norm_eps)
        self.y_proj = nn.Linear(d, d, bias=False)
        self.norm = CognateRMSNorm(d, config.rms_norm_eps)
        self.halt_proj = nn.Linear(d, 1)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def backbone(self, x):
        cfg = self.config
        b, t, d = x.shape
        p = cfg.num_persistent
        h = torch.cat([self.persistent.unsqueeze(0).expand(b, -1, -1), x], dim=1) if p else x
        length = p + t
        hd = d // cfg.num_heads
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd)
        freqs = torch.arange(length, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        i = torch.arange(length, device=x.device)[:, None]
        j = torch.arange(length, device=x.device)[None, :]
        mask = (j < p) | ((j <= i) & (i - j < cfg.window))
        usage = []
        for layer in self.layers:
            h, g = layer(h, cos, sin, mask)
            usage.append((1.0 - g[:, p:]).mean(-1))
        return h[:, p:], torch.stack(usage).mean(0)

    def forward(self, input_ids):
        """Per-pass logits (K, B, T, V), halting probabilities (K, B, T) and memory shares (K, B, T); in eval mode
        the passes stop once every token has halted (the ACT mixture gives them no weight)."""
        cfg = self.config
        x = self.embed_tokens(input_ids)
        y = torch.zeros_like(x)
        z = torch.zeros_like(x)
        logits, halts, usages = [], [], []
        total = torch.zeros(x.shape[:2], dtype=x.dtype, device=x.device)
        for _ in range(cfg.max_passes):
            y, z = y.detach(), z.detach()
            z, usage = self.backbone(x + y + z)
            y = y + self.y_proj(self.latent_norm(z))
            yf = self.norm(y)
            logits.append(F.linear(yf, self.embed_tokens.weight))
            halt = torch.sigmoid(self.halt_proj(yf))[..., 0]
            halts.append(halt)
            usages.append(usage)
            total = total + halt
            if not self.training and bool((total >= cfg.act_threshold).all()):
                break
        return torch.stack(logits), torch.stack(halts), torch.stack(usages)


def act_weights(halt, threshold, max_passes):
    """Graves' ACT: weights h_1..h_{N-1}, R = 1 - sum_{k<N} h_k at the halting pass N; returns (weights, N, R)."""
    k = halt.shape[0]
    cum = halt.cumsum(0)
    before = torch.cat([torch.zeros_like(halt[:1]), cum[:-1]], dim=0)
    running = before < threshold
    last = (torch.arange(k, device=halt.device) == max_passes - 1).view(-1, *([1] * (halt.dim() - 1)))
    stops = running & ((cum >= threshold) | last)
    weights = torch.where(stops, 1.0 - before, torch.where(running, halt, torch.zeros_like(halt)))
    return weights, running.sum(0).to(halt.dtype), torch.where(stops, 1.0 - before, torch.zeros_like(halt)).sum(0)


class CognateForCausalLM(CognatePreTrainedModel, GenerationMixin):
    _supports_cache_class = False

    def __init__(self, config):
        super().__init__(config)
        self.model = CognateModel(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return None  # the head is the embedding matrix (read in forward), so resizing the input resizes both

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def forward(self, input_ids=None, attention_mask=None, labels=None, return_dict=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("Cognate models do not take padded batches: pass one sequence, or equal lengths")
        pass_logits, halt, usage = self.model(input_ids)
        weights, steps, remainder = act_weights(halt, self.config.act_threshold, self.config.max_passes)
        logits = torch.einsum("kbt,kbtv->btv", weights, pass_logits)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        mem = (weights * usage).sum(0)
        return CognateCausalLMOutput(loss=loss, logits=logits, steps=steps, ponder=steps + remainder,
                                     memory_usage=mem)
