"""Per-sample losses and gradient norms of a batch: the supervisor's diagnosis kernel.

For every example in a :class:`~aegis.train.data.Batch`, the loss is its own mean next-token
NLL and the gradient norm is the global L2 norm of that loss's gradient with respect to the
trainable pytree (the LoRA adapters, or all params in full fine-tuning). It is computed with
``jax.vmap(jax.value_and_grad(...))`` under ``jit``, ``chunk_size`` samples at a time
(``jax.lax.map`` over chunks), and each chunk reduces its gradients to norms before the next
starts, so memory holds at most ``chunk_size`` gradients whatever the batch size.

Packed rows work too: sample ``k`` is evaluated on its row with the loss masked to its own
tokens; since attention never crosses segments, that is exactly its stand-alone gradient.

    report = analyze_batch(model, state.trainable, frozen, batch, chunk_size=8)
    report.outliers(z=3.0)              # sample ids whose gradient norm stands out
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from pydantic import Field

from aegis.errors import InvalidConfigError
from aegis.schema import Frozen
from aegis.train.data import Batch
from aegis.train.step import token_loss_sum

__all__ = ["SampleReport", "BatchForensics", "analyze_batch", "per_sample_arrays"]


class SampleReport(Frozen):
    """One sample's diagnosis."""

    sample_id: str
    loss: float = Field(description="Mean next-token NLL over the sample's target tokens.")
    grad_norm: float = Field(description="Global L2 norm of the gradient of that loss w.r.t. the trainable params.")
    tokens: int = Field(description="Target tokens of the sample in this batch.")


class BatchForensics(Frozen):
    """Per-sample losses and gradient norms of one batch, in batch order."""

    samples: tuple[SampleReport, ...]

    @property
    def sample_ids(self) -> tuple[str, ...]:
        return tuple(s.sample_id for s in self.samples)

    @property
    def losses(self) -> np.ndarray:
        return np.array([s.loss for s in self.samples])

    @property
    def grad_norms(self) -> np.ndarray:
        return np.array([s.grad_norm for s in self.samples])

    def top(self, k: int = 5, *, by: str = "grad_norm") -> tuple[SampleReport, ...]:
        """The ``k`` samples with the largest ``grad_norm`` (or ``loss``); non-finite values first."""
        key = lambda s: (not np.isfinite(getattr(s, by)), np.nan_to_num(getattr(s, by), nan=0.0))  # noqa: E731
        return tuple(sorted(self.samples, key=key, reverse=True)[:k])

    def outliers(self, z: float = 3.0) -> tuple[str, ...]:
        """Sample ids whose gradient norm is non-finite or above median + ``z`` x MAD (robust z-score)."""
        norms = self.grad_norms
        finite = norms[np.isfinite(norms)]
        if finite.size == 0:
            return self.sample_ids
        med = float(np.median(finite))
        mad = float(np.median(np.abs(finite - med))) * 1.4826 or max(abs(med) * 1e-3, 1e-12)
        return tuple(
            s.sample_id for s in self.samples if not np.isfinite(s.grad_norm) or (s.grad_norm - med) / mad > z
        )


def per_sample_arrays(batch: Batch) -> dict[str, np.ndarray]:
    """One ``[n, s]`` row per sample: its batch row, with the loss mask restricted to its tokens."""
    n = len(batch.sample_ids)
    rows = np.zeros(n, np.int64)
    for k in range(n):
        where = np.argwhere(batch.sample_index == k)
        rows[k] = where[0, 0]
    own = batch.sample_index[rows] == np.arange(n)[:, None]
    return {
        "input_ids": batch.input_ids[rows],
        "targets": batch.targets[rows],
        "loss_mask": (batch.loss_mask[rows] * own).astype(np.float32),
        "segment_ids": batch.segment_ids[rows],
        "positions": batch.positions[rows],
    }


_CACHE: dict[tuple, Any] = {}


def _kernel(model: Any, chunk_size: int, chunked_ce: bool, chunk_tokens: int) -> Any:
    key = (id(model), chunk_size, chunked_ce, chunk_tokens)
    if key in _CACHE:
        return _CACHE[key][1]

    def sample_loss(trainable: Any, frozen: Any, sample: dict) -> jax.Array:
        one = jax.tree.map(lambda x: x[None], sample)
        total, count = token_loss_sum(model, trainable, frozen, one, chunked=chunked_ce, chunk_tokens=chunk_tokens)
        return total / jnp.maximum(count, 1.0)

    per_sample = jax.vmap(jax.value_and_grad(sample_loss), in_axes=(None, None, 0))

    @jax.jit
    def run(trainable: Any, frozen: Any, samples: dict) -> tuple[jax.Array, jax.Array]:
        def one_chunk(chunk: dict) -> tuple[jax.Array, jax.Array]:
            losses, grads = per_sample(trainable, frozen, chunk)
            norms = jax.vmap(optax.global_norm)(grads)
            return losses, norms

        chunks = jax.tree.map(lambda x: x.reshape(-1, chunk_size, *x.shape[1:]), samples)
        losses, norms = jax.lax.map(one_chunk, chunks)
        return losses.reshape(-1), norms.reshape(-1)

    _CACHE[key] = (model, run)  # keep the model alive so its id stays unique
    return run


def analyze_batch(
    model: Any,
    trainable: Any,
    frozen: Any,
    batch: Batch,
    *,
    chunk_size: int = 8,
    chunked_cross_entropy: bool = False,
    chunk_tokens: int = 1024,
) -> BatchForensics:
    """Per-sample losses and gradient norms of ``batch``.

    ``trainable``/``frozen`` as in the train step: full fine-tuning passes the params and
    ``frozen=None``; LoRA passes the adapter pytree and the (possibly NF4) base. The sample
    count is padded up to a multiple of ``chunk_size`` with empty samples, which are dropped.
    """
    if chunk_size < 1:
        raise InvalidConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    n = len(batch.sample_ids)
    if n == 0:
        return BatchForensics(samples=())
    arrays = per_sample_arrays(batch)
    pad = (-n) % chunk_size
    if pad:
        arrays = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in arrays.items()}
        arrays["segment_ids"][n:] = 1  # a valid (fully masked) segment keeps the padding rows NaN-free
    run = _kernel(model, chunk_size, chunked_cross_entropy, chunk_tokens)
    losses, norms = jax.device_get(run(trainable, frozen, arrays))
    tokens = arrays["loss_mask"][:n].sum(axis=1)
    return BatchForensics(
        samples=tuple(
            SampleReport(sample_id=sid, loss=float(losses[k]), grad_norm=float(norms[k]), tokens=int(tokens[k]))
            for k, sid in enumerate(batch.sample_ids)
        )
    )
