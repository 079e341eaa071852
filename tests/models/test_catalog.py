"""The model catalog: Hub files kept byte for byte, converted configs agree with published parameter counts
and with transformers, one naming rule with no shared names, and a lazy, fast load."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from importlib import resources

import pytest
from pydantic import ValidationError

from aegis.models import catalog
from aegis.models.catalog import CatalogModel, PublishedCount
from aegis.models.catalog._aliases import key
from aegis.models.families import supported_model_types
from aegis.models.profiles import profile_from_config
from tools.check_catalog import counts_of, verdict
from tools.import_catalog import Shape, hf_config

MODELS = catalog.models()
FILES = resources.files("aegis.models.catalog").joinpath("models")

# The Hub config.json files the catalog started from: others tested against them, so they never change.
HUB_FILES = {
    # rebuilt from a library's values and kept because the sha256 equals the Hub file's (catalog_sources.hash_verified)
    "stabilityai--stablelm-3b-4e1t.json": "6a8e761cc1117804",
    "openai-community--gpt2.json": "0daed7749b4f02b8",
    "openai-community--gpt2-medium.json": "ef1a44d889ad1a0a",
    "openai-community--gpt2-large.json": "7fccdcfd66220553",
    "openai-community--gpt2-xl.json": "be48115d52314bc2",
    "distilbert--distilgpt2.json": "4ec5947c1d59fee6",
    "facebook--opt-125m.json": "54162c9cd0377110",
    "facebook--opt-1.3b.json": "f1aaceefb7d34d34",
    "facebook--opt-6.7b.json": "05bcf525449fe484",
    "facebook--opt-30b.json": "b8a260a845f4cc70",
    "stabilityai--stablelm-2-1_6b.json": "e14f378901a37d07",
    "EleutherAI--pythia-70m.json": "002050231a9b1ec3",
    "EleutherAI--pythia-160m.json": "76eb275107220e45",
    "EleutherAI--pythia-1b.json": "302d6702a29de103",
    "EleutherAI--pythia-12b.json": "0209f3579c4f3fad",
    "EleutherAI--gpt-neox-20b.json": "0c13687d6cfccbe2",
    "tiiuae--falcon-7b.json": "ef0b96fb53bf7627",
    "tiiuae--falcon-40b.json": "0976177b24951f9b",
    "microsoft--phi-1.json": "6a6a640160005481",
    "meta-llama--Llama-3.1-8B.json": "c71777653c779930",
    "meta-llama--Llama-3.1-70B.json": "ee1fea8d720770dc",
    "meta-llama--Llama-3.2-1B.json": "bfb5d39c327ee5c3",
    "meta-llama--Llama-3.2-3B.json": "35f063e9f381e867",
    "Qwen--Qwen2.5-0.5B.json": "479dcf0c5286339e",
    "Qwen--Qwen2.5-1.5B.json": "0e8c8aa86468aba0",
    "Qwen--Qwen2.5-7B.json": "ab60e1872eb673c8",
    "Qwen--Qwen2.5-14B.json": "fdb89460be9a6383",
    "Qwen--Qwen2.5-32B.json": "2c003fe40b13d2d1",
    "Qwen--Qwen2.5-72B.json": "d9113a671ad92740",
    "Qwen--Qwen3-0.6B.json": "cfbd7059ee9d6c98",
    "Qwen--Qwen3-8B.json": "deaa300e5384a480",
    "mistralai--Mistral-7B-v0.3.json": "affafc6478ec0fd0",
    "microsoft--Phi-3-mini-4k-instruct.json": "93b8ac65a3a142a3",
    "google--gemma-2-2b.json": "56ee4e528fedfe70",
    "google--gemma-2-9b.json": "800e3f504f8e76ef",
    "google--gemma-3-1b-pt.json": "4dd5218cebc4fdea",
    "google--gemma-3-4b-pt.json": "882cb9537df7ebe5",
    "mistralai--Mixtral-8x7B-v0.1.json": "9d56d04b36d0fd12",
    "Qwen--Qwen1.5-MoE-A2.7B.json": "d0b1cd8f35beccb7",
    "Qwen--Qwen3-30B-A3B.json": "98a4cf452e3d94b7",
}


# ------------------------------------------------------------------------------------------- contents


def test_catalog_is_broad_and_every_file_is_listed_once():
    assert len(MODELS) >= 120
    files = [m.file for m in MODELS]
    assert len(files) == len(set(files))
    assert {f.name for f in FILES.iterdir() if f.name.endswith(".json")} == set(files)
    families = {m.family for m in MODELS}
    assert {"llama-2", "codellama", "llama-3", "llama-3.1", "llama-3.2", "llama-3.3", "qwen2", "qwen2.5", "qwen3",
            "gemma-2", "gemma-3", "phi-3", "phi-3.5", "phi-4", "mistral", "mixtral", "smollm2", "tinyllama",
            "deepseek-r1"} <= families
    assert {"coder", "math", "distill", "base", "instruct"} <= {m.variant for m in MODELS}


def test_hub_files_are_byte_identical():
    hub = {m.file for m in MODELS if m.source.library == "hub"}
    assert hub == set(HUB_FILES)
    for name, digest in HUB_FILES.items():
        assert hashlib.sha256(FILES.joinpath(name).read_bytes()).hexdigest()[:16] == digest, name


def test_every_entry_says_where_its_config_came_from():
    for m in MODELS:
        assert m.source.entry and (m.source.library == "hub" or m.source.version), m.id
        assert m.published, f"{m.id}: no published parameter count"
        assert all(why for why in m.source.overrides.values()), m.id
    converted = {m.source.library for m in MODELS} - {"hub"}
    assert converted <= {"litgpt", "torchtune", "github"} and {"litgpt", "torchtune"} <= converted


def test_aliases_are_not_written_in_the_index():
    raw = json.loads(resources.files("aegis.models.catalog").joinpath("models.json").read_text())
    assert not any("aliases" in row for row in raw)
    with pytest.raises(ValidationError):
        CatalogModel.model_validate({**raw[0], "aliases": ["llama"]})


@pytest.mark.parametrize("entry", MODELS, ids=[m.id for m in MODELS])
def test_published_counts_agree_within_their_precision(entry):
    """The planner's count from shapes against every figure the entry cites; a figure known to disagree must
    say why and must really disagree (so a stale explanation does not linger)."""
    counts = counts_of(entry)
    for figure in entry.published:
        got = counts[figure.counts]
        assert verdict(figure, got) != "MISMATCH", (entry.id, figure.value, got)
        assert figure.agrees(got) != bool(figure.disagrees), (entry.id, figure.value, got)


def test_published_figure_precision():
    def fig(value: str) -> PublishedCount:
        return PublishedCount(value=value, where="test")

    assert (fig("8,030,261,248").params, fig("8,030,261,248").tolerance) == (8_030_261_248, 0)
    assert (fig("7.61B").params, fig("7.61B").tolerance) == (7_610_000_000, 10_000_000)
    assert (fig("13B").tolerance, fig("300M").tolerance, fig("3,209M").tolerance) == (10**9, 10**8, 10**6)
    assert fig("1.23B").agrees(1_235_814_400) and fig("1.24B").agrees(1_235_814_400)  # truncated or rounded
    assert not fig("32.5B").agrees(32_763_876_352)


ONE_PER_MODEL_TYPE = list({catalog.read_model_config(m)["model_type"]: m for m in MODELS}.values())


@pytest.mark.parametrize("entry", ONE_PER_MODEL_TYPE, ids=[m.id for m in ONE_PER_MODEL_TYPE])
def test_converted_configs_build_in_transformers_with_the_planners_count(entry):
    """A sample (one per model_type; tests/models/test_resolve.py builds them all): transformers' meta-device model of the
    bundled config has exactly the parameters the planner counts from shapes."""
    import torch
    import transformers

    config = catalog.read_model_config(entry)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    assert sum(p.numel() for p in model.parameters()) == counts_of(entry)["total"]


def test_every_config_is_a_supported_family():
    for m in MODELS:
        config = catalog.read_model_config(m)
        assert config["model_type"] in supported_model_types(), m.id
        profile = profile_from_config(config, model_id=m.id, source="catalog")
        assert profile.max_position_embeddings > 0 and profile.total_params > 0


def _shape_of(hub: dict) -> Shape:
    """The `Shape` a source would give for a vendored Hub config (its own numbers)."""
    heads = hub["num_attention_heads"]
    return Shape(
        hidden=hub["hidden_size"], layers=hub["num_hidden_layers"], heads=heads,
        kv_heads=hub.get("num_key_value_heads", hub.get("num_kv_heads", 1 if hub.get("multi_query") else heads)), head_dim=hub.get("head_dim", hub["hidden_size"] // heads),
        intermediate=hub.get("intermediate_size", hub.get("ffn_hidden_size", 4 * hub["hidden_size"])),
        vocab=hub["vocab_size"], max_positions=hub.get("max_position_embeddings", 2048),
        rope_theta=hub.get("rope_theta", hub.get("rotary_emb_base", 10_000)),
        eps=hub.get("rms_norm_eps", hub.get("layer_norm_eps", hub.get("layer_norm_epsilon"))),
        tied=hub.get("tie_word_embeddings", False),
        partial_rotary=hub.get("partial_rotary_factor", hub.get("rotary_pct", 1.0)),
        bias=hub.get("use_qkv_bias", hub.get("bias", False)),
        parallel_residual=hub.get("use_parallel_residual", hub.get("parallel_attn", hub["model_type"] == "gpt_neox")),
        hidden_act=hub.get("hidden_act"),
        shared_norm=not (hub.get("new_decoder_architecture") and hub.get("num_ln_in_parallel_attn") != 1),
        rope=hub.get("rope_scaling"),
        sliding_window=hub.get("sliding_window") if hub["model_type"] != "phi3" else hub["sliding_window"] + 1,
        experts=hub.get("num_local_experts", hub.get("num_experts", 0)), top_k=hub.get("num_experts_per_tok", 0),
        expert_width=hub.get("moe_intermediate_size", 0), query_pre_attn_scalar=hub.get("query_pre_attn_scalar"),
        attn_softcap=hub.get("attn_logit_softcapping"), final_softcap=hub.get("final_logit_softcapping"),
        rope_local_base=hub.get("rope_local_base_freq"),
    )


@pytest.mark.parametrize("name", sorted(n for n in HUB_FILES if "MoE-A2.7B" not in n and "phi-1" not in n
                                         and "gpt2" not in n and "opt-" not in n))
def test_the_converter_writes_what_the_hub_publishes(name):
    """tools/import_catalog's config writer, given a Hub config's own numbers, writes every key that file
    has with the file's value (Qwen1.5-MoE, Phi-1, GPT-2 and OPT: no converted model of their type)."""
    hub = json.loads(FILES.joinpath(name).read_text())
    ours = hf_config(hub["model_type"], _shape_of(hub))
    from aegis.models.architectures import registry

    tie_default = bool(registry.get(hub["model_type"]).defaults.get("tie_word_embeddings", False))
    assert ours.get("tie_word_embeddings", tie_default) == hub.get("tie_word_embeddings", tie_default)
    differs = {k: (hub[k], v) for k, v in ours.items() if k in hub and hub[k] != v}
    assert not differs


# ------------------------------------------------------------------------------------------- names


def test_no_two_entries_share_a_name():
    owners: dict[tuple[str, ...], str] = {}
    for m in MODELS:
        for name in (m.id, *m.aliases):
            assert owners.setdefault(key(name), m.id) == m.id, (name, m.id, owners[key(name)])


def test_the_stored_name_index_is_the_rules_output_for_the_committed_catalog():
    """names.json is what the naming rule derives from models.json now (rewrite it with
    `python -m tools.import_catalog --names` after editing models.json)."""
    stored = resources.files("aegis.models.catalog").joinpath("names.json").read_text(encoding="utf-8")
    assert stored == catalog.name_index(), "names.json is stale: run python -m tools.import_catalog --names"
    derived = catalog._aliases.alias_owners(catalog.names())
    assert catalog._owners() == derived
    assert catalog.name_keys() == {key(n): owner for owner, found in derived.items() for n in found}


def test_a_name_index_for_another_catalog_is_ignored(monkeypatch):
    """An index whose sha256 is not models.json's (a hand-edited catalog) is not read: the names are derived."""
    monkeypatch.setattr(catalog, "_models_text", lambda: catalog._read_text("models.json") + " ")
    for cached in (catalog._stored_index, catalog._owners, catalog.name_keys):
        cached.cache_clear()
    monkeypatch.setattr(catalog._aliases, "alias_owners", lambda entries: {"derived": ("Yes-1B",)})
    try:
        assert catalog._owners() == {"derived": ("Yes-1B",)}
        assert catalog.name_keys() == {key("Yes-1B"): "derived"}
    finally:
        for cached in (catalog._stored_index, catalog._owners, catalog.name_keys):
            cached.cache_clear()


@pytest.mark.parametrize("entry", MODELS, ids=[m.id for m in MODELS])
def test_every_id_and_alias_finds_its_entry(entry):
    for name in (*entry.ids, *entry.aliases, *(i.split("/", 1)[1] for i in entry.ids)):
        assert catalog.find_model(name) == entry, name
        assert catalog.find_model(name.upper()) == entry, name
    for hub_id in entry.ids:
        assert catalog.model_entry(hub_id) == entry


@pytest.mark.parametrize(("name", "model_id"), [
    ("llama3.1:8b", "meta-llama/Llama-3.1-8B"),          # Ollama name:size
    ("Llama 3.1 8B", "meta-llama/Llama-3.1-8B"),
    ("meta-llama-3.1-8b", "meta-llama/Llama-3.1-8B"),     # the repository's former name
    ("llama3-8b", "meta-llama/Meta-Llama-3-8B"),
    ("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("qwen2.5:7b", "Qwen/Qwen2.5-7B"),
    ("qwen-2.5-7b", "Qwen/Qwen2.5-7B"),
    ("qwen2.5-coder:7b", "Qwen/Qwen2.5-Coder-7B"),
    ("Qwen2.5-Coder-7B-Instruct", "Qwen/Qwen2.5-Coder-7B"),  # same config: one entry, both ids
    ("qwen3:30b", "Qwen/Qwen3-30B-A3B"),                   # a MoE size by its total
    ("qwen3:30b-a3b", "Qwen/Qwen3-30B-A3B"),
    ("phi3:mini", "microsoft/Phi-3-mini-4k-instruct"),
    ("phi-3-mini-4k", "microsoft/Phi-3-mini-4k-instruct"),
    ("gemma-3-4b", "google/gemma-3-4b-pt"),
    ("gemma3:4b", "google/gemma-3-4b-pt"),
    ("gemma2-9b", "google/gemma-2-9b"),
    ("mixtral:8x7b", "mistralai/Mixtral-8x7B-v0.1"),
    ("mistral-7b", "mistralai/Mistral-7B-v0.3"),
    ("deepseek-r1:7b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"),
    ("smollm2:135m", "HuggingFaceTB/SmolLM2-135M"),
    ("yi:34b", "01-ai/Yi-34B"),                            # the base, now bundled beside Yi-34B-Chat
    ("yi-1.5-9b", "01-ai/Yi-1.5-9B"),
    ("yi-1.5-34b-chat", "01-ai/Yi-1.5-34B-Chat"),          # not the -Chat-16K entry, whose stem it is
    ("qwen2:7b", "Qwen/Qwen2-7B"),
    ("granite-3.0-8b", "ibm-granite/granite-3.0-8b-base"),  # the base is listed before the instruct
    ("granite3.1-moe:3b", "ibm-granite/granite-3.1-3b-a800m-base"),
    ("qwen3-coder:480b", "Qwen/Qwen3-Coder-480B-A35B-Instruct"),
    ("deepseek-coder:6.7b", "deepseek-ai/deepseek-coder-6.7b-base"),  # a specialised line named without its variant
    ("deepseek-coder-v1.5:7b", "deepseek-ai/deepseek-coder-7b-base-v1.5"),
    ("deepseek-llm:67b", "deepseek-ai/deepseek-llm-67b-base"),
    ("deepseek-math:7b", "deepseek-ai/deepseek-math-7b-base"),
    ("qwen1.5:7b", "Qwen/Qwen1.5-7B"),
    ("qwen-1.5-110b", "Qwen/Qwen1.5-110B"),
    ("codeqwen1.5:7b", "Qwen/CodeQwen1.5-7B"),
])
def test_the_naming_rule(name, model_id):
    assert catalog.find_model(name).id == model_id


@pytest.mark.parametrize("name", ["qwen2.5", "mistral", "gemma3", "llama", "phi3", "qwen3-moe", "falcon2-11b", "qwen:7b",
                                  "deepseek-coder:7b", "qwen1.5"])
def test_names_without_a_size_or_of_another_model_name_nothing(name):
    assert catalog.find_model(name) is None


def test_search_filters():
    ids = lambda found: {m.id for m in found}  # noqa: E731
    assert "codellama/CodeLlama-34b-hf" not in ids(catalog.search("llama-3"))
    assert {"meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-3.1-8B"} <= ids(catalog.search("llama-3"))
    assert ids(catalog.search(family="qwen3", size="30b")) == {
        "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base", "Qwen/Qwen3-30B-A3B-Instruct-2507"}
    assert {m.family for m in catalog.search(family="llama")} == {"llama-2", "llama-3", "llama-3.1", "llama-3.2",
                                                                  "llama-3.3"}
    assert all(m.variant == "coder" for m in catalog.search("coder"))
    assert catalog.search("smol", size="1.7b")[0].id == "HuggingFaceTB/SmolLM2-1.7B"
    assert catalog.search("no-such-model") == []


# ------------------------------------------------------------------------------------------- speed, CLI


def test_importing_aegis_reads_no_catalog_and_one_lookup_builds_the_index():
    code = (
        "import aegis\nfrom aegis.models import catalog\n"
        "assert catalog.models.cache_info().currsize == 0\n"
        "aegis.estimate_memory('llama-3.1-8b', method='qlora', micro_batch_size=4, seq_len=1024)\n"
        "assert catalog.find_model('llama3.1:8b').id == 'meta-llama/Llama-3.1-8B'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_models_searches_and_shows_family_counts_context_and_source():
    from typer.testing import CliRunner

    from aegis.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["models", "--help"]).exit_code == 0
    rows = json.loads(runner.invoke(app, ["models", "qwen3", "--size", "30b", "--json"]).output)
    assert {r["id"] for r in rows} == {"Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base", "Qwen/Qwen3-30B-A3B-Instruct-2507",
                                       "Qwen/Qwen3-Coder-30B-A3B-Instruct"}
    row = next(r for r in rows if r["id"] == "Qwen/Qwen3-30B-A3B-Base")
    assert (row["family"], row["size"], row["context"]) == ("qwen3", "30b-a3b", 32768)
    assert row["params"] == 30_532_122_624 and row["active_params"] < row["params"] / 5
    assert row["source"].startswith("litgpt 0.5.13 Qwen3-30B-A3B-Base")
    text = runner.invoke(app, ["models", "--family", "gemma-2"]).output
    assert "gemma-2-27b" in text and "Hub config.json" in text and "litgpt" in text
    missing = runner.invoke(app, ["models", "no-such-model"])
    assert missing.exit_code == 1 and "config.json" in missing.output


def test_cli_models_imports_nothing_heavy():
    code = (
        "import sys, json\nfrom aegis.cli import main\n"
        "try:\n    main(['models', '--json'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps([m for m in ('torch', 'transformers', 'jax', 'gradio') if m in sys.modules]), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == []
