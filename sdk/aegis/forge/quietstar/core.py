"""Quiet-STaR on the engine (Zelikman et al., 2024, "Quiet-STaR: Language Models Can Teach Themselves to Think
Before Speaking"): pure JAX functions over the engine's params (any :class:`aegis.train.modeling.Model`).

At each scored position ``i`` of a text, ``K`` thoughts ``[thinking] t_1..t_T [/endthinking]`` are sampled in
parallel (one row per position and thought, the context ``x_<=i`` before it); the hidden state after the thought
predicts the true next ``n_true`` tokens ``x_{i+1..i+n}`` (teacher-forced after the thought), and a mixing head
``w = sigmoid(MLP([h_base; h_thought]))`` interpolates the post-thought and the base next-token distributions.
The loss is the mixed NLL of the true tokens, REINFORCE on the thought tokens with reward ``log p(true | thought)
- mean over the K thoughts`` (the paper's baseline), and ``kl * KL(p_base || p_baked)`` to the baked model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ThoughtSpec", "init_mixer", "mix_weight", "build_rows", "sample_thoughts", "quietstar_loss",
           "base_logprobs", "answer_accuracy", "answer_scores", "bake_loss", "edit_distance", "thought_ends"]


@dataclass(frozen=True)
class ThoughtSpec:
    """Token ids and sizes of the thoughts: markers, length ``T``, thoughts per position ``K``, true tokens ``n``."""

    start_id: int
    end_id: int
    pad_id: int
    length: int
    num_thoughts: int
    n_true: int
    banned: tuple[int, ...] = ()  # never sampled inside a thought (the start marker, padding)


def init_mixer(rng: jax.Array, hidden: int, width: int | None = None) -> dict[str, jax.Array]:
    """The mixing head: ``[h_base; h_thought] -> width -> 1`` (ReLU), last layer zero so ``w`` starts at 0.5."""
    width = width or hidden
    return {"w1": jax.random.normal(rng, (width, 2 * hidden)) * (2 * hidden) ** -0.5, "b1": jnp.zeros(width),
            "w2": jnp.zeros((1, width)), "b2": jnp.zeros(1)}


def mix_weight(mixer: dict[str, jax.Array], h_base: jax.Array, h_post: jax.Array) -> jax.Array:
    """``w`` in (0, 1), the weight of the post-thought distribution, for hidden states ``[..., d]`` -> ``[...]``."""
    x = jnp.concatenate([h_base, h_post], axis=-1).astype(jnp.float32)
    z = jax.nn.relu(x @ mixer["w1"].T + mixer["b1"]) @ mixer["w2"].T + mixer["b2"]
    return jax.nn.sigmoid(z[..., 0])


def build_rows(x: jax.Array, pos: jax.Array, spec: ThoughtSpec) -> tuple[jax.Array, jax.Array]:
    """Rows ``x_<=i [thinking] pad*T [/endthinking] x_{i+1..i+n} pad...`` for each (sequence, position).

    ``x [B, S]``, ``pos [B, P]`` -> ``rows [B*P, S+T+2+n]`` and the rows' ``pos [B*P]``."""
    b, s = x.shape
    p = pos.shape[1]
    length = s + spec.length + 2 + spec.n_true
    xr = jnp.repeat(x, p, axis=0)
    i = pos.reshape(-1)[:, None]
    j = jnp.arange(length)[None, :]
    t1 = i + 2 + spec.length  # thought slots [i + 2, t1)
    src = jnp.clip(j - spec.length - 2, 0, s - 1)  # after the thought: x shifted by T+2
    after = jnp.take_along_axis(xr, src, axis=1)
    before = jnp.take_along_axis(xr, jnp.clip(j, 0, s - 1), axis=1)
    rows = jnp.where(j <= i, before, spec.pad_id)
    rows = jnp.where(j == i + 1, spec.start_id, rows)
    rows = jnp.where(j == t1, spec.end_id, rows)
    in_true = (j > t1) & (j <= t1 + spec.n_true) & (j - spec.length - 2 < s)
    rows = jnp.where(in_true, after, rows)
    return rows.astype(jnp.int32), pos.reshape(-1)


def sample_thoughts(model: Any, params: Any, rows: jax.Array, pos: jax.Array, spec: ThoughtSpec, rng: jax.Array,
                    temperature: float) -> jax.Array:
    """Fill the thought slots token by token (one forward per token); temperature 0 is greedy."""
    n = rows.shape[0]
    ar = jnp.arange(n)
    ban = jnp.zeros(model.config["vocab_size"], bool).at[jnp.asarray(spec.banned + (spec.pad_id,), jnp.int32)].set(True)

    def body(t: int, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        rows, rng = carry
        rng, key = jax.random.split(rng)
        at = pos + 1 + t  # the token before slot t
        h = model.hidden(params, rows)
        logits = model.project(h[ar, at], model.head_weight(params))
        logits = jnp.where(ban[: logits.shape[-1]], -1e30, logits)
        if temperature > 0:
            tok = jax.random.categorical(key, logits / temperature)
        else:
            tok = jnp.argmax(logits, -1)
        return rows.at[ar, at + 1].set(tok.astype(jnp.int32)), rng

    rows, _ = jax.lax.fori_loop(0, spec.length, body, (rows, rng))
    return jax.lax.stop_gradient(_close_early(rows, pos, spec))


def _close_early(rows: jax.Array, pos: jax.Array, spec: ThoughtSpec) -> jax.Array:
    """A thought whose sampled tokens include the end marker ends there: what ``build_rows`` placed after the
    forced end (the true tokens, then padding) moves left to follow the model's own marker, and the tokens sampled
    after it are dropped. Baked thoughts are as long as their reasoning (shorter than ``T`` for most rows), so a
    model that learned them closes its thought early; continuing to sample after its marker put ``T`` minus that
    many off-distribution tokens between the thought and the answer."""
    width = rows.shape[1]
    j = jnp.arange(width)[None, :]
    t1 = (pos + 2 + spec.length)[:, None]
    end = jnp.min(jnp.where((rows == spec.end_id) & (j >= pos[:, None] + 2) & (j < t1), j, t1), axis=1)
    src = jnp.where(j <= end[:, None], j, j + (t1 - end[:, None]))
    moved = jnp.take_along_axis(rows, jnp.clip(src, 0, width - 1), axis=1)
    return jnp.where(src < width, moved, spec.pad_id).astype(rows.dtype)


def thought_ends(rows: jax.Array, pos: jax.Array, spec: ThoughtSpec) -> jax.Array:
    """``[R]`` index of the end marker closing each row's thought (rows from :func:`sample_thoughts`, thought at
    ``pos``): the model's own marker where it ended the thought early, else the one ``build_rows`` forced after
    ``T`` tokens. The marker's position predicts the first token after the thought."""
    j = jnp.arange(rows.shape[1])[None, :]
    t1 = pos + 2 + spec.length
    return jnp.min(jnp.where((rows == spec.end_id) & (j >= pos[:, None] + 2), j, t1[:, None]), axis=1)


def base_logprobs(model: Any, params: Any, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(log p [B, S, V], hidden [B, S, d])`` of the plain text."""
    h = model.hidden(params, x)
    return jax.nn.log_softmax(model.project(h, model.head_weight(params)), -1), h


def _true_targets(x: jax.Array, pos: jax.Array, spec: ThoughtSpec, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Targets ``x_{i+1+m}`` ``[R, n]`` and their validity (inside the text, not padding, scored)."""
    b, s = x.shape
    p = pos.shape[0] // b
    xr = jnp.repeat(x, p, axis=0)
    idx = pos[:, None] + 1 + jnp.arange(spec.n_true)[None, :]
    ok = idx < s
    tgt = jnp.take_along_axis(xr, jnp.clip(idx, 0, s - 1), axis=1)
    mr = jnp.repeat(mask, p, axis=0)
    ok = ok & (tgt != spec.pad_id) & jnp.take_along_axis(mr, jnp.clip(idx - 1, 0, s - 1), axis=1)
    return tgt, ok


def quietstar_loss(params: Any, mixer: Any, baked: Any, model: Any, x: jax.Array, mask: jax.Array, pos: jax.Array,
                   pos_w: jax.Array, rows: jax.Array, spec: ThoughtSpec, kl_coef: float,
                   reinforce_weight: float = 1.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The Quiet-STaR loss of sampled ``rows`` (from :func:`sample_thoughts`, K consecutive rows per position).

    ``x [B, S]`` text, ``mask [B, S]`` (1 where predicting ``x_{i+1}`` counts), ``pos``/``pos_w [B, P]`` the
    positions thought at and their weights (0: a filler position)."""
    k = spec.num_thoughts
    b, s = x.shape
    logp_base, h_base = base_logprobs(model, params, x)
    posr = jnp.repeat(pos, k, axis=1).reshape(-1)  # row order: (b, p, k), as build_rows(x, repeat(pos, k))
    tgt, ok = _true_targets(x, posr, spec, mask)
    ok = ok & (jnp.repeat(pos_w, k, axis=1).reshape(-1) > 0)[:, None]
    # base predictions of x_{i+1+m} sit at position i+m
    bidx = jnp.repeat(jnp.arange(b), pos.shape[1] * k)
    base_at = jnp.clip(posr[:, None] + jnp.arange(spec.n_true)[None, :], 0, s - 1)
    lb = logp_base[bidx[:, None], base_at]  # [R, n, V]
    hb = h_base[bidx[:, None], base_at]
    h_rows = model.hidden(params, rows)
    logp_rows = jax.nn.log_softmax(model.project(h_rows, model.head_weight(params)), -1)
    ar = jnp.arange(rows.shape[0])[:, None]
    # thought tokens: slot t (row index posr+2+t) predicted at posr+1+t, up to the model's own end marker if it
    # closed the thought early (that choice is part of the thought), else all T slots
    ends = thought_ends(rows, posr, spec)
    t_at = posr[:, None] + 1 + jnp.arange(spec.length)[None, :]
    t_tok = rows[ar, t_at + 1]
    in_thought = t_at + 1 <= ends[:, None]
    logp_thought = (jnp.take_along_axis(logp_rows[ar, t_at], t_tok[..., None], -1)[..., 0] * in_thought).sum(-1)
    # after the thought: the end marker predicts x_{i+1}
    post_at = ends[:, None] + jnp.arange(spec.n_true)[None, :]
    lp = logp_rows[ar, post_at]
    w = mix_weight(mixer, hb, h_rows[ar, post_at])[..., None]
    logp_mix = jnp.logaddexp(jnp.log(w + 1e-9) + lp, jnp.log1p(-w + 1e-9) + lb)
    true_lp = jnp.take_along_axis(logp_mix, tgt[..., None], -1)[..., 0] * ok  # [R, n]
    seq_lp = true_lp.sum(-1)
    nll = -true_lp.sum() / jnp.maximum(ok.sum(), 1)
    group = seq_lp.reshape(-1, k)
    reward = jax.lax.stop_gradient(group - group.mean(-1, keepdims=True)).reshape(-1)
    valid = ok.any(-1)
    reinforce = -(reward * logp_thought * valid).sum() / jnp.maximum(valid.sum(), 1)
    # KL(p_theta || p_baked) of the base next-token distributions at the scored positions
    logp_baked = jax.lax.stop_gradient(base_logprobs(model, baked, x)[0])
    kl_pos = (jnp.exp(logp_base) * (logp_base - logp_baked)).sum(-1)
    kl = (kl_pos * mask).sum() / jnp.maximum(mask.sum(), 1)
    loss = nll + reinforce_weight * reinforce + kl_coef * kl
    return loss, {"nll": nll, "reinforce": reinforce, "kl": kl, "reward_std": reward.std(),
                  "mix_weight": (w[..., 0] * ok).sum() / jnp.maximum(ok.sum(), 1)}


def bake_loss(params: Any, model: Any, x: jax.Array, mask: jax.Array) -> jax.Array:
    """Prompt baking's supervised loss: cross-entropy of ``x_{i+1}`` where ``mask[i]``."""
    logp = jax.nn.log_softmax(model.apply(params, x[:, :-1]), -1)
    lp = jnp.take_along_axis(logp, x[:, 1:, None], -1)[..., 0]
    m = mask[:, :-1]
    return -(lp * m).sum() / jnp.maximum(m.sum(), 1)


def answer_accuracy(model: Any, params: Any, mixer: Any, prompts: jax.Array, lengths: jax.Array, answers: jax.Array,
                    spec: ThoughtSpec, *, thoughts: bool, rng: jax.Array, temperature: float = 0.0,
                    disallowed: tuple[int, ...] = ()) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Teacher-forced exact match of the answer tokens after each prompt; ``prompts [B, S]`` hold prompt + answer
    (padded), ``lengths [B]`` the prompt lengths, ``answers [B, n]`` (pad = skip). Without thoughts: the base
    prediction; with: a thought after the prompt (greedy at temperature 0), then the mixed prediction.
    Thought markers (``disallowed``) are never an answer. Returns ``(correct [B], predictions [B, n], rows)``."""
    spec1 = ThoughtSpec(spec.start_id, spec.end_id, spec.pad_id, spec.length, 1, answers.shape[1], spec.banned)
    pos = (lengths - 1)[:, None]
    logp_base, h_base = base_logprobs(model, params, prompts)
    b = prompts.shape[0]
    at = jnp.clip(pos + jnp.arange(spec1.n_true)[None, :], 0, prompts.shape[1] - 1)
    lb = logp_base[jnp.arange(b)[:, None], at]
    rows = None
    if thoughts:
        rows, posr = build_rows(prompts, pos, spec1)
        rows = sample_thoughts(model, params, rows, posr, spec1, rng, temperature)
        h_rows = model.hidden(params, rows)
        post_at = thought_ends(rows, posr, spec1)[:, None] + jnp.arange(spec1.n_true)[None, :]
        ar = jnp.arange(b)[:, None]
        lp = jax.nn.log_softmax(model.project(h_rows[ar, post_at], model.head_weight(params)), -1)
        w = mix_weight(mixer, h_base[jnp.arange(b)[:, None], at], h_rows[ar, post_at])[..., None]
        lb = jnp.logaddexp(jnp.log(w + 1e-9) + lp, jnp.log1p(-w + 1e-9) + lb)
    if disallowed:
        lb = lb.at[..., jnp.asarray(disallowed)].set(-jnp.inf)
    pred = jnp.argmax(lb, -1)
    valid = answers != spec.pad_id
    correct = jnp.all((pred == answers) | ~valid, axis=-1)
    return correct, pred, rows


def answer_scores(model: Any, params: Any, mixer: Any, prompts: jax.Array, lengths: jax.Array, candidates: jax.Array,
                  spec: ThoughtSpec, *, thoughts: bool, rng: jax.Array,
                  temperature: float = 0.0) -> tuple[jax.Array, jax.Array | None]:
    """Format-free scoring (as lm-evaluation-harness scores a multiple choice): the summed log-likelihood of each
    valid answer's tokens, teacher-forced after each prompt; the model's answer is the argmax over the answers, so
    a row is scored on which answer the model prefers, never on whether it writes the answer's format.

    ``prompts [B, S]`` (only the first ``lengths[b]`` tokens are read), ``candidates [C, n]`` the answers' tokens
    (``spec.pad_id`` past an answer's end). With ``thoughts``, one thought is sampled from the prompt alone (greedy
    at temperature 0) and every answer is scored after it with the mixing head's mixture of the post-thought and
    the base distributions, as Quiet-STaR trains. Returns ``(scores [B, C], thought rows [B, ...] or None)``."""
    b, s = prompts.shape
    c, n = candidates.shape
    valid = candidates != spec.pad_id  # [C, n]
    L = lengths[:, None]
    j = jnp.arange(s + n)[None, :]
    padded = jnp.pad(prompts, ((0, 0), (0, n)), constant_values=spec.pad_id)
    head = jnp.where(j < L, padded, spec.pad_id)
    src = jnp.clip(j - L, 0, n - 1)
    in_ans = (j >= L) & (j < L + n)
    # x[b*C + c] = prompt_b + answer_c
    x = jnp.stack([jnp.where(in_ans, candidates[ci][src], head) for ci in range(c)], axis=1).reshape(b * c, s + n)
    r = jnp.arange(b * c)[:, None]
    at = jnp.repeat(L - 1, c, axis=0) + jnp.arange(n)[None, :]  # base predictions of answer token m sit at L-1+m
    logp_base, h_base = base_logprobs(model, params, x)
    lp = logp_base[r, at]  # [B*C, n, V]
    rows = None
    if thoughts:
        spec1 = ThoughtSpec(spec.start_id, spec.end_id, spec.pad_id, spec.length, 1, n, spec.banned)
        rows, posr = build_rows(prompts, L - 1, spec1)
        rows = sample_thoughts(model, params, rows, posr, spec1, rng, temperature)
        rc = jnp.repeat(rows, c, axis=0)
        t1 = jnp.repeat(thought_ends(rows, posr, spec1), c)[:, None]  # the end marker; answer token m at t1+1+m
        jj = jnp.arange(rc.shape[1])[None, :]
        cand = jnp.tile(candidates, (b, 1))  # [B*C, n], row b*C + c holds answer c
        slot = jnp.clip(jj - t1 - 1, 0, n - 1)
        rc = jnp.where((jj > t1) & (jj <= t1 + n), jnp.take_along_axis(cand, slot, axis=1), rc)
        h_rows = model.hidden(params, rc)
        post_at = t1 + jnp.arange(n)[None, :]
        lp_post = jax.nn.log_softmax(model.project(h_rows[r, post_at], model.head_weight(params)), -1)
        w = mix_weight(mixer, h_base[r, at], h_rows[r, post_at])[..., None]
        lp = jnp.logaddexp(jnp.log(w + 1e-9) + lp_post, jnp.log1p(-w + 1e-9) + lp)
    tgt = jnp.tile(candidates, (b, 1))
    tok_lp = jnp.take_along_axis(lp, tgt[..., None], -1)[..., 0] * jnp.tile(valid, (b, 1))
    return tok_lp.sum(-1).reshape(b, c), rows


def edit_distance(a: list[int] | np.ndarray, b: list[int] | np.ndarray) -> int:
    """Levenshtein distance of two token sequences."""
    a, b = list(a), list(b)
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]
