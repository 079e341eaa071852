"""Reading a model's config.json from the Hugging Face Hub, with the network mocked (pytest-httpx2 over the Hub
client's own httpx2 transport): a fetched config plans like a bundled one and lands in the cache, the Hub's refusals
become one-line errors, and a machine without network is told so at once instead of after the client's retries."""

from __future__ import annotations

import json
import time

import httpx
import pytest

import aegis
from aegis.models.resolve import _load, resolve_model

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 3, "vocab_size": 1000,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}


@pytest.fixture
def online(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _load.cache_clear()
    yield
    _load.cache_clear()


def _url(repo: str) -> str:
    return f"https://huggingface.co/{repo}/resolve/main/config.json"


def test_a_hub_config_is_fetched_cached_and_counted_as_transformers_counts(online, httpx2_mock):
    body = json.dumps(CONFIG).encode()
    headers = {"X-Repo-Commit": "a" * 40, "ETag": '"cafe01"', "Content-Length": str(len(body))}
    head = httpx2_mock.head(_url("acme/tiny-llama")).mock(return_value=httpx.Response(200, headers=headers))
    get = httpx2_mock.get(_url("acme/tiny-llama")).mock(return_value=httpx.Response(200, headers=headers, content=body))
    profile = resolve_model("acme/tiny-llama")
    assert profile.source == "hub" and profile.model_id == "acme/tiny-llama"

    import torch
    import transformers

    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**CONFIG))
    assert profile.total_params == sum(p.numel() for p in reference.parameters())
    assert get.call_count == 1
    _load.cache_clear()  # a second lookup reads the cache: no request at all
    requests = head.call_count
    assert resolve_model("acme/tiny-llama").source == "cache"
    assert (head.call_count, get.call_count) == (requests, 1)


@pytest.mark.parametrize(("status", "code", "message"), [
    (404, "RepoNotFound", "no such model on the Hugging Face Hub"),
    (403, "GatedRepo", "is gated: accept its licence"),
    (404, "EntryNotFound", "has no config.json on the Hub"),
])
def test_the_hubs_refusals_are_one_line_errors(online, httpx2_mock, status, code, message):
    httpx2_mock.head(_url("acme/missing")).mock(
        return_value=httpx.Response(status, headers={"X-Error-Code": code, "X-Error-Message": code}))
    with pytest.raises((aegis.UnknownModelError, aegis.OfflineError), match=message) as err:
        resolve_model("acme/missing")
    assert "\n" not in str(err.value)


def test_no_network_is_reported_at_once_without_the_clients_retries(online, httpx2_mock):
    route = httpx2_mock.head(_url("acme/far-away")).mock(side_effect=httpx.ConnectError("Name or service not known"))
    start = time.perf_counter()
    with pytest.raises(aegis.OfflineError, match="cannot reach the Hugging Face Hub for acme/far-away"):
        resolve_model("acme/far-away")
    assert route.call_count == 1  # hf_hub_download alone retries 5 times with 1+2+4+8+8 s of backoff
    assert time.perf_counter() - start < 5
