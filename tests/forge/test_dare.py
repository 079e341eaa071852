"""DARE's random drop masks, checked statistically: the kept share is the density within a binomial bound,
kept entries are scaled by one factor per tensor (mergekit 0.1.5 matches the pruned delta's L1 norm to the
unpruned one: 1/density in expectation), dropped entries are exactly the base's, and a seed makes it
reproducible. dare_ties is compared with mergekit's own random merge through the same statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aegis.forge import merge_models
from tests.forge.conftest import fill, read_folder


def _dare_linear(models, out, density, *, rescale=True, seed=0):
    cfg = {
        "merge_method": "dare_linear",
        "base_model": "base",
        "models": [{"model": "a", "parameters": {"weight": 1.0, "density": density}}],
        "parameters": {"rescale": rescale},
    }
    merge_models(fill(cfg, models), out, seed=seed)
    return read_folder(out)


def _deltas(models, merged):
    base, a = read_folder(models["base"]), read_folder(models["a"])
    for name in merged:
        b = base[name].astype(np.float64)
        m = merged[name].astype(np.float64)
        yield name, a[name].astype(np.float64) - b, m - b, max(np.abs(b).max(), np.abs(m).max())


def _binomial_ok(k: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(k - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("density", [0.1, 0.3, 0.7])
def test_kept_share_is_density_and_kept_entries_share_one_factor(models, tmp_path, density):
    merged = _dare_linear(models, tmp_path / "out", density)
    kept_total = n_total = 0
    for name, delta, d_out, scale in _deltas(models, merged):
        kept = d_out != 0
        n, k = delta.size, int(kept.sum())
        assert _binomial_ok(k, n, density), f"{name}: kept {k} of {n}, density {density}"
        kept_total, n_total = kept_total + k, n_total + n
        # one factor for the tensor: L1(delta) / L1(kept delta); dropped entries are the base's exactly
        factor = np.abs(delta).sum() / np.abs(delta[kept]).sum()
        ulp = np.spacing(np.float32(max(scale, 1e-3))) * 4
        np.testing.assert_allclose(d_out, np.where(kept, factor * delta, 0.0), rtol=0, atol=ulp, err_msg=name)
        # ... which is 1/density up to the sampling error of a kept share of |delta|
        rel_sd = math.sqrt((1 - density) / (n * density) * math.pi / 2)
        assert abs(factor * density - 1) <= 6 * rel_sd, f"{name}: factor {factor:.4f} vs 1/density {1 / density:.4f}"
    assert _binomial_ok(kept_total, n_total, density, sigmas=4)


def test_without_rescale_kept_entries_are_the_delta(models, tmp_path):
    merged = _dare_linear(models, tmp_path / "out", 0.4, rescale=False)
    for name, delta, d_out, scale in _deltas(models, merged):
        kept = d_out != 0
        ulp = np.spacing(np.float32(max(scale, 1e-3))) * 4
        np.testing.assert_allclose(d_out, np.where(kept, delta, 0.0), rtol=0, atol=ulp, err_msg=name)


def test_seed_makes_masks_reproducible(models, tmp_path):
    one = _dare_linear(models, tmp_path / "one", 0.5, seed=7)
    two = _dare_linear(models, tmp_path / "two", 0.5, seed=7)
    other = _dare_linear(models, tmp_path / "other", 0.5, seed=8)
    name = "model.layers.0.mlp.up_proj.weight"
    assert all(np.array_equal(one[k], two[k]) for k in one)
    assert not np.array_equal(one[name], other[name])


def test_dare_ties_matches_mergekit_in_distribution(models, tmp_path, mergekit_merge):
    cfg = fill({
        "merge_method": "dare_ties",
        "base_model": "base",
        "models": [
            {"model": "a", "parameters": {"weight": 0.6, "density": 0.5}},
            {"model": "b", "parameters": {"weight": 0.4, "density": 0.3}},
        ],
        "parameters": {"normalize": True},
    }, models)
    merge_models(cfg, tmp_path / "aegis", seed=0)
    mergekit_merge(cfg, tmp_path / "mergekit", seed=0)
    base = read_folder(models["base"])
    ours, theirs = read_folder(tmp_path / "aegis"), read_folder(tmp_path / "mergekit")
    changed = {}
    for label, merged in (("aegis", ours), ("mergekit", theirs)):
        moved = [(merged[k].astype(np.float64) - base[k]) for k in base]
        n = sum(m.size for m in moved)
        changed[label] = (sum(int((m != 0).sum()) for m in moved), n, sum(float(np.abs(m).sum()) for m in moved) / n)
    (k1, n, mean1), (k2, _, mean2) = changed["aegis"], changed["mergekit"]
    p = (k1 + k2) / (2 * n)
    assert abs(k1 - k2) <= 6 * math.sqrt(2 * n * p * (1 - p)), changed  # same share of entries changed
    assert abs(mean1 / mean2 - 1) < 0.05, changed  # same mean size of the change
