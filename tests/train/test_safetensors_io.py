"""The safetensors layer against the `safetensors` library and transformers: every dtype round-trips, a file of one
dtype is byte for byte what `safetensors.numpy.save_file` writes, and a sharded folder with its index loads in
transformers as the model it was written from."""

from __future__ import annotations

import copy
import json

import ml_dtypes
import numpy as np
import pytest
from aegis.errors import CheckpointError
from aegis.train.safetensors_io import (
    DTYPES,
    INDEX_FILE,
    SINGLE_FILE,
    CheckpointReader,
    code_of,
    numpy_dtype,
    write_file,
    write_shards,
)
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def _sample(code: str, shape=(3, 5), seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = DTYPES[code]
    if code == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dtype)


@pytest.mark.parametrize("code", list(DTYPES))
def test_every_dtype_round_trips_through_the_library(code, tmp_path):
    tensors = {"w": _sample(code), "b": _sample(code, (7,), seed=1), "empty": _sample(code, (0, 4))}
    ours = write_file(tmp_path / "ours.safetensors", tensors)
    save_file(tensors, str(tmp_path / "lib.safetensors"), metadata={"format": "pt"})
    assert ours.read_bytes() == (tmp_path / "lib.safetensors").read_bytes()  # one dtype: the library's exact bytes
    back = load_file(str(ours))
    assert sorted(back) == sorted(tensors)
    for name, arr in tensors.items():
        assert back[name].dtype == arr.dtype and back[name].shape == arr.shape
        np.testing.assert_array_equal(back[name].view(np.uint8), arr.view(np.uint8))
    with safe_open(str(ours), framework="numpy") as f:
        names = f.keys()
        assert {str(f.get_slice(n).get_dtype()) for n in names} == {code}


def test_mixed_dtypes_and_the_engine_reader_agree_with_the_library(tmp_path):
    tensors = {f"t.{code}": _sample(code, seed=i) for i, code in enumerate(DTYPES)}
    write_file(tmp_path / "ours.safetensors", tensors, {"format": "pt", "note": "x"})
    back = load_file(str(tmp_path / "ours.safetensors"))
    for name, arr in tensors.items():
        np.testing.assert_array_equal(back[name].view(np.uint8), arr.view(np.uint8))
    with safe_open(str(tmp_path / "ours.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "note": "x"}
    # the engine's reader on a file the library wrote (its order: by dtype alignment): a view, and one readinto
    save_file(tensors, str(tmp_path / "lib.safetensors"))
    reader = CheckpointReader(tmp_path / "lib.safetensors")
    for code in ("F64", "F32", "F16", "BF16"):
        arr = tensors[f"t.{code}"]
        assert reader.dtype_name(f"t.{code}") == code
        np.testing.assert_array_equal(reader.get(f"t.{code}"), arr)
        out = np.empty_like(arr)
        reader.read_into(f"t.{code}", out)
        np.testing.assert_array_equal(out, arr)
    cast = np.empty((3, 5), np.float32)
    reader.read_into("t.BF16", cast)  # another dtype: a cast
    np.testing.assert_array_equal(cast, tensors["t.BF16"].astype(np.float32))
    with pytest.raises(CheckpointError, match="unsupported dtype I8"):
        reader.get("t.I8")


def test_dtype_names_codes_and_jax():
    jnp = pytest.importorskip("jax.numpy")
    assert code_of("bfloat16") == code_of(jnp.bfloat16) == code_of(ml_dtypes.bfloat16) == "BF16"
    assert code_of(np.float32) == code_of("float32") == "F32" and code_of(jnp.int8) == "I8"
    assert numpy_dtype("BF16") == numpy_dtype(jnp.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert jnp.asarray(np.ones(2, numpy_dtype("bfloat16"))).dtype == jnp.bfloat16
    with pytest.raises(CheckpointError, match="cannot save tensor 'c'"):
        write_file("unused.safetensors", {"c": np.ones(2, np.complex64)})


def test_sharded_folder_loads_in_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.to(torch.bfloat16))  # the weights bf16 holds exactly
    tensors = {k: v.detach().numpy().astype(ml_dtypes.bfloat16) for k, v in hf.state_dict().items()}
    out = tmp_path / "ours"
    files = write_shards(out, tensors, max_shard_bytes=10_000)
    config.save_pretrained(out)
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((out / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors.values())
    assert sorted(index["weight_map"]) == sorted(tensors) and sorted(set(index["weight_map"].values())) == files
    # transformers' own sharded save of the same model: the same index keys and names of the same pattern
    copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(tmp_path / "hf", max_shard_size="10KB")
    theirs = json.loads((tmp_path / "hf" / INDEX_FILE).read_text())
    assert set(theirs) == set(index) and set(theirs["metadata"]) >= {"total_size"}
    assert sorted(theirs["weight_map"]) == sorted(index["weight_map"])
    assert theirs["metadata"]["total_size"] == index["metadata"]["total_size"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 77]])
    with torch.no_grad():
        want = hf(ids).logits
        got = loaded(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # one file below the shard size: model.safetensors, no index
    assert write_shards(tmp_path / "one", tensors) == [SINGLE_FILE] and not (tmp_path / "one" / INDEX_FILE).exists()
