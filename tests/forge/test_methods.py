"""The numpy kernels against mergekit's own functions on random tensors (slerp's lerp fallback, zero
vectors, TIES trimming and sign election), and the registry's parameter specs against mergekit's."""

from __future__ import annotations

import numpy as np
import pytest

from aegis.errors import InvalidConfigError
from aegis.forge._methods import METHODS, MERGEKIT_ONLY, _majority_mask, get_method, slerp, sparsify

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def mk():
    pytest.importorskip("mergekit")
    import mergekit.merge_methods.generalized_task_arithmetic as gta
    import mergekit.merge_methods.slerp as mslerp
    import mergekit.sparsify as msparsify

    return mslerp, msparsify, gta


def _pairs(rng):
    v0 = rng.standard_normal((48, 32)).astype(np.float32)
    yield "random", v0, rng.standard_normal((48, 32)).astype(np.float32)
    yield "close", v0, v0 + 0.3 * rng.standard_normal((48, 32)).astype(np.float32)
    yield "parallel", v0, 2 * v0
    yield "nearly-parallel", v0, v0 + 1e-4 * rng.standard_normal((48, 32)).astype(np.float32)
    yield "antiparallel", v0, -v0
    yield "zero", np.zeros_like(v0), v0
    yield "vector", v0[0], rng.standard_normal(32).astype(np.float32)


@pytest.mark.parametrize("t", [0.0, 0.3, 0.5, 1.0])
def test_slerp_matches_mergekit(mk, t):
    mslerp = mk[0]
    for label, v0, v1 in _pairs(np.random.default_rng(0)):
        ours = slerp(t, v0, v1)
        theirs = mslerp.slerp(torch.tensor([t]), torch.from_numpy(v0)[None], torch.from_numpy(v1)[None])[0].numpy()
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6, err_msg=label)
        assert ours.dtype == np.float32


def test_slerp_falls_back_to_lerp_when_nearly_parallel():
    rng = np.random.default_rng(1)
    v0 = rng.standard_normal(1000).astype(np.float32)
    v1 = v0 + 1e-3 * rng.standard_normal(1000).astype(np.float32)  # cos ~ 1 - 5e-7 > 0.9995
    np.testing.assert_array_equal(slerp(0.25, v0, v1), np.float32(0.75) * v0 + np.float32(0.25) * v1)
    far = rng.standard_normal(1000).astype(np.float32)  # cos ~ 0: not a lerp, the norm is kept
    mid = slerp(0.5, v0 / np.linalg.norm(v0), far / np.linalg.norm(far))
    assert abs(np.linalg.norm(mid) - 1) < 1e-3


@pytest.mark.parametrize("density", [0.0, 0.01, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("rescale", [False, True])
def test_magnitude_trim_matches_mergekit(mk, density, rescale):
    msparsify = mk[1]
    x = np.random.default_rng(2).standard_normal((64, 40)).astype(np.float32)
    ours = sparsify(x, density, "magnitude", rescale, np.random.default_rng(0))
    theirs = msparsify.magnitude(torch.from_numpy(x), density, msparsify.RescaleNorm.l1 if rescale else None).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_half_precision_trim_differs_from_mergekit_only_among_equal_magnitudes(mk):
    import ml_dtypes

    msparsify = mk[1]
    x = (np.random.default_rng(4).standard_normal((256, 64)) * 0.01).astype(ml_dtypes.bfloat16).astype(np.float32)
    ours = sparsify(x, 0.5, "magnitude", False, np.random.default_rng(0))
    theirs = msparsify.magnitude(torch.from_numpy(x).bfloat16(), 0.5).float().numpy()
    w = np.abs(x)
    threshold = np.sort(w.reshape(-1))[::-1][x.size // 2 - 1]
    assert (ours != 0).sum() == (theirs != 0).sum() == x.size // 2
    assert np.all(w[ours != theirs] == threshold)  # torch's unstable sort picks other equals at the threshold


def test_sign_election_matches_mergekit(mk):
    gta = mk[2]
    deltas = np.random.default_rng(3).standard_normal((3, 50, 20)).astype(np.float32)
    deltas[1, :5] = 0
    theirs = gta.get_mask(torch.from_numpy(deltas), method="sum").numpy()
    np.testing.assert_array_equal(_majority_mask(deltas), theirs)


def test_parameter_specs_match_mergekit(mk):
    from mergekit.merge_methods import registered_methods

    theirs = {m.spec.name: m.spec for m in registered_methods()}
    assert set(METHODS) | set(MERGEKIT_ONLY) == set(theirs)
    for name, method in METHODS.items():
        spec = theirs[name]
        want = {p.name: (p.scope.value, None if p.required else p.default) for p in spec.parameters}
        got = {p.name: (p.scope, None if p.required else p.default) for p in method.params}
        assert got == want, name
        assert method.base == spec.contract.base.value, name
        assert (method.min_inputs, method.max_inputs) == (spec.contract.min_inputs, spec.contract.max_inputs), name


def test_unknown_and_unimplemented_methods_name_the_fix():
    with pytest.raises(InvalidConfigError, match="did you mean 'ties'"):
        get_method("tie")
    with pytest.raises(InvalidConfigError, match="does not implement yet"):
        get_method("della")
