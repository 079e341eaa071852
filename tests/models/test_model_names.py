"""Model names: never a confident plan for a different model.

One decision (`aegis.models.resolve.match_model`) serves the parser and the loader, so they agree on every name; a name
whose family, version, size or variant is not bundled (and not in the local Hub cache) is an error naming the
close bundled models and how to pass a config.json — never another model. The expectations below are an
oracle independent of the implementation: the id a name may resolve to, as a pattern, so they hold whatever
the catalog bundles (an unbundled name today may be bundled tomorrow, but never as another model).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aegis.models import catalog
from aegis.errors import OfflineError, UnknownModelError
from aegis.models.resolve import canonical_model_id, match_model, names_one_model, resolve_model
from aegis.planning.parse import parse_request_lenient

LLAMA8 = "meta-llama/Llama-3.1-8B"


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No model is cached on this machine (whatever the developer's own cache holds)."""
    from huggingface_hub import constants

    cache = tmp_path_factory.mktemp("hf-cache")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def _flat(model_id: str) -> str:
    return model_id.lower().replace("_", "-")


# name → the pattern any id it resolves to must match (the model it names); None: it names no one model
NAMES: list[tuple[str, str | None]] = [
    # bundled ids, aliases and spellings of them
    ("llama-3.1-8b", r"llama-3\.1-8b"), ("Llama 3.1 8B", r"llama-3\.1-8b"), ("llama3.1:8b", r"llama-3\.1-8b"),
    ("LLAMA-3.1-8B", r"llama-3\.1-8b"), ("meta-llama/Llama-3.1-8B", r"llama-3\.1-8b"), ("llama-8b", r"llama-3\.\d-8b"),
    ("llama-3.1-70b", r"llama-3\.1-70b"), ("llama3.2:1b", r"llama-3\.2-1b"), ("qwen2.5-7b", r"qwen2\.5-7b"),
    ("qwen2.5:0.5b", r"qwen2\.5-0\.5b"), ("qwen2.5-500m", r"qwen2\.5-0\.5b"), ("qwen3-8b", r"qwen3-8b"),
    ("qwen3:30b", r"qwen3-30b-a3b"), ("qwen3-30b-a3b", r"qwen3-30b-a3b"), ("mistral-7b", r"mistral-7b"),
    ("mixtral-8x7b", r"mixtral-8x7b"), ("mixtral:8x7b", r"mixtral-8x7b"), ("phi-3-mini", r"phi-3-mini"),
    ("phi3:mini", r"phi-3-mini"), ("gemma2:2b", r"gemma-2-2b"), ("gemma3-4b", r"gemma-3-4b"), ("gemma3:1b", r"gemma-3-1b"),
    ("qwen1.5-moe-a2.7b", r"qwen1\.5-moe-a2\.7b"),
    # instruct/base siblings: the same config.json
    ("Qwen2.5-7B-Instruct", r"qwen2\.5-7b"), ("Qwen/Qwen2.5-0.5B-Instruct", r"qwen2\.5-0\.5b"),
    ("gemma-2-9b-it", r"gemma-2-9b"), ("gemma-3-4b-it", r"gemma-3-4b"), ("google/gemma-3-4b-it", r"gemma-3-4b"),
    ("meta-llama/Llama-3.1-8B-Instruct", r"llama-3\.1-8b"), ("llama-3.1-8b-instruct", r"llama-3\.1-8b"),
    ("mistral-7b-instruct-v0.3", r"mistral-7b.*v0\.3"), ("mistral:7b-instruct-v0.3-q4_0", r"mistral-7b.*v0\.3"),
    ("llama3.1:8b-instruct-q4_K_M", r"llama-3\.1-8b"),
    # misspellings: within the family and size, or an error
    ("lama-3.1-8b", r"llama-3\.1-8b"), ("gema-3-4b", r"gemma-3-4b"), ("lama-8b", r"llama-3\.\d-8b"),
    ("mistrl-7b", r"mistral-7b"), ("qwen2.5-7b-instrcut", r"qwen2\.5-7b"), ("qwen2.5-8b-instuct", None),
    ("llama-3.1-8b-instuct", r"llama-3\.1-8b-instruct"), ("yi:34b-v1.5", r"yi-1\.5-34b"),
    # sizes not bundled today
    ("gemma-3-27b", r"gemma-3-27b"), ("gemma-3-12b", r"gemma-3-12b"), ("gemma3:27b", r"gemma-3-27b"),
    ("qwen3-14b", r"qwen3-14b"), ("qwen3:14b", r"qwen3-14b"), ("Qwen3 32B", r"qwen3-32b"),
    ("qwen3-235b-a22b", r"qwen3-235b-a22b"), ("gemma-2-27b", r"gemma-2-27b"), ("llama-3.1-405b", r"llama-3\.1-405b"),
    ("llama 13b", r"llama-(?:2-)?13b"), ("qwen2.5-3b", r"qwen2\.5-3b"), ("mixtral-8x22b", r"mixtral-8x22b"),
    ("gemma2:27b", r"gemma-2-27b"), ("llama3.1:latest", r"llama-3\.1-8b"),
    # other variants and families
    ("mistral-small-24b", r"mistral-small.*24b"), ("mistral-nemo", r"mistral-nemo"), ("phi-3-medium", r"phi-3-medium"),
    ("phi3:medium", r"phi-3-medium"), ("phi-3-mini-128k-instruct", r"phi-3-mini-128k"),
    ("qwen2.5-coder-32b", r"qwen2\.5-coder-32b"), ("qwen2.5-coder-7b", r"qwen2\.5-coder-7b"),
    ("mistral-7b-instruct-v0.2", r"mistral-7b.*v0\.2"), ("llama-3.2-11b-vision", r"llama-3\.2-11b-vision"),
    ("deepseek-v3", r"deepseek-v3"), ("deepseek-r1", r"deepseek-r1"), ("falcon-7b", r"falcon-7b"), ("yi-34b", r"yi-1\.5-34b|yi-34b"),
    # Hub ids
    ("Qwen/Qwen3-14B", r"qwen/qwen3-14b"), ("google/gemma-3-27b-it", r"google/gemma-3-27b"),
    ("mistralai/Mistral-Nemo-Instruct-2407", r"mistral-nemo"), ("myorg/custom-7b", r"myorg/custom-7b"),
    ("unsloth/Llama-3.1-8B", r"llama-3\.1-8b"),
]

RESOLVES = ["llama-3.1-8b", "Llama 3.1 8B", "llama3.1:8b", "meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct",
            "lama-3.1-8b", "llama3.1:8b-instruct-q4_K_M", "Qwen2.5-7B-Instruct", "qwen2.5-500m", "qwen3:30b", "gemma-3-4b-it",
            "google/gemma-3-4b-it", "gema-3-4b", "mistral:7b-instruct-v0.3-q4_0", "mixtral:8x7b", "phi3:mini"]
"""Names that resolve with the catalog as of this test (an expanded catalog keeps them)."""

NEVER_BUNDLED = ["gemma-3-19b", "qwen3-13b", "qwen2.5-9b", "llama-3.1-19b", "mistral-nemo-19b", "phi-3-tiny"]
"""Sizes and variants no one publishes: errors whatever the catalog holds."""

ISSUE_NAMES = {
    "gemma-3-27b": r"gemma-3-27b", "gemma-3-12b": r"gemma-3-12b", "qwen3-14b": r"qwen3-14b", "qwen3-32b": r"qwen3-32b",
    "qwen3-235b-a22b": r"qwen3-235b-a22b", "mistral-small-24b": r"mistral-small.*24b", "mistral-nemo": r"mistral-nemo",
    "gemma-2-27b": r"gemma-2-27b", "phi-3-medium": r"phi-3-medium", "qwen2.5-coder-32b": r"qwen2\.5-coder-32b",
    "deepseek-v3": r"deepseek-v3",
}
"""The names of the issue ("never the wrong model"), each once planned as another bundled model (or none)."""


def _parsed(name: str) -> tuple[str | None, str | None]:
    """(model, model issue message) of the request 'lora NAME on h100'."""
    result = parse_request_lenient(f"lora {name} on h100")
    issue = next((i for i in result.issues if i.part == "model"), None)
    assert result.request.gpu == "h100-sxm" and result.request.method == "lora", result  # the rest is still read
    return result.request.model, issue.message if issue else None


def _resolved(name: str) -> tuple[str | None, Exception | None]:
    try:
        return resolve_model(name).model_id, None
    except (UnknownModelError, OfflineError) as err:
        return None, err


@pytest.mark.parametrize(("name", "pattern"), NAMES, ids=[n for n, _ in NAMES])
def test_parser_and_resolver_give_the_same_answer_and_never_another_model(name: str, pattern: str | None) -> None:
    model, issue = _parsed(name)
    resolved, error = _resolved(name)
    if isinstance(error, OfflineError):  # a Hub id neither bundled nor cached: read as itself, fetched online
        assert model == name == match_model(name).model_id and issue is None
        assert name in str(error) and "config.json" in str(error)
    else:  # the parser keeps the Hub id of a sibling planned with its bundled config (ModelMatch.weights_id)
        assert model == resolved or (error is None and model == match_model(name).weights_id), (model, issue, resolved, error)
        assert (issue is None) == (error is None)
    if model is not None:
        assert pattern is not None and re.search(pattern, _flat(model)), f"{name!r} planned as {model}"
    else:
        assert issue == str(error) and "\n" not in issue
        assert "--model ./path/config.json" in issue or "ambiguous" in issue


def test_the_list_is_large_and_resolves_what_is_bundled() -> None:
    assert len(NAMES) >= 60 and len({n for n, _ in NAMES}) == len(NAMES)
    for name in RESOLVES:
        assert _resolved(name)[0] is not None and _parsed(name)[0] == _resolved(name)[0], name


@pytest.mark.parametrize("name", NEVER_BUNDLED + list(ISSUE_NAMES))
def test_issue_names_are_the_model_itself_or_an_error_listing_close_models(name: str) -> None:
    model, issue = _parsed(name)
    resolved, error = _resolved(name)
    assert model == resolved
    if model is not None:  # bundled by now: as itself, never as another size or variant
        assert name in ISSUE_NAMES and re.search(ISSUE_NAMES[name], _flat(model)), model
        return
    assert isinstance(error, UnknownModelError) and str(error) == issue and "\n" not in issue
    assert f"unknown model {name!r}" in issue and "--model ./path/config.json" in issue
    family = re.match(r"[a-z]+", name).group()
    if family != "deepseek":  # a bundled family: its models are listed first
        first = re.search(r"did you mean ([^,?]+)", issue).group(1)
        assert family in first.lower(), issue


def test_the_chat_example_is_not_planned_as_another_model() -> None:
    text = "how much memory would gemma-3-27b need for lora on an h100?"
    result = parse_request_lenient(text)
    model, issue = _parsed("gemma-3-27b")
    assert result.request.model == model
    if model is None:
        assert [i.message for i in result.issues] == [issue]
    else:
        assert re.search(r"gemma-3-27b", _flat(model)) and not result.issues


# ------------------------------------------------------------------------------------ the rules


def test_variant_sharing_a_config_says_which_config_is_used() -> None:
    """A sibling planned with another bundled config (same family, version, size) names the config used."""
    shared = [n for n in ("llama-3.1-8b-chat", "gemma-3-4b-it", "qwen2.5-7b-chat", "qwen3-8b-instruct")
              if match_model(n).note]
    assert shared, "no instruct/base sibling is planned with another config"
    for name in shared:
        found = match_model(name)
        assert found.source == "catalog" and found.note.startswith(f"{found.model_id} (config used for {name})")
        result = parse_request_lenient(f"lora {name} on h100")
        assert result.request.model == found.model_id and found.note in result.notes
        assert resolve_model(name).model_id == found.model_id
    assert match_model("qwen2.5-7b").note == ""  # the bundled model itself: nothing to say


@pytest.mark.parametrize(("name", "pattern"), [("lama-3.1-8b", r"llama-3\.1-8b$"), ("gema-3-4b", r"gemma-3-4b"),
                                               ("qwen3-13b", None), ("lama-3.1-13b", None), ("lama-8b", None),
                                               ("mistrl-nemo", None), ("qwen-3-14", None)])
def test_spelling_is_corrected_within_family_and_size_only(name: str, pattern: str | None) -> None:
    try:
        found = match_model(name)
    except UnknownModelError:
        assert pattern is None or catalog.model_entry(LLAMA8) is None
        return
    assert pattern is not None and re.search(pattern, _flat(found.model_id)), found
    assert canonical_model_id(name) == found.model_id and "spelling" in found.note


def test_sizes_compare_as_numbers_with_units() -> None:
    assert match_model("qwen2.5-500m").model_id == match_model("qwen2.5-0.5b").model_id == "Qwen/Qwen2.5-0.5B"
    assert match_model("qwen3-30b").model_id == match_model("qwen3:30b-a3b").model_id == "Qwen/Qwen3-30B-A3B"
    assert match_model("Mixtral 8x7B").model_id == "mistralai/Mixtral-8x7B-v0.1"
    with pytest.raises(UnknownModelError):
        match_model("qwen3-30b-a6b")  # same total, another active size
    with pytest.raises(UnknownModelError):
        match_model("qwen2.5-0.6b")


def test_names_one_model_tells_a_name_from_a_family() -> None:
    assert all(names_one_model(n) for n in ("gemma-3-27b", "mistral nemo", "deepseek-v3", "llama 13b", "qwen3"))
    assert not any(names_one_model(n) for n in ("small qwen", "qwen", "deepseek", "the model"))


def _cache_model(cache: Path, repo_id: str, config: dict) -> None:
    """A Hub cache entry laid out as huggingface_hub writes one (refs/main → snapshots/<commit>/config.json)."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "snapshots" / commit / "config.json").write_text(json.dumps(config))


def test_the_local_hub_cache_resolves_a_model_by_its_id_and_its_name(empty_hub_cache: Path) -> None:
    config = {**resolve_model("qwen3-8b").config, "num_hidden_layers": 40, "hidden_size": 5120,
              "intermediate_size": 17408, "num_attention_heads": 40}
    _cache_model(empty_hub_cache, "Qwen/Qwen3-14B", config)
    _cache_model(empty_hub_cache, "Qwen/Qwen3-13B", config)  # a size no one publishes: never bundled
    for name in ("Qwen/Qwen3-13B", "qwen3-13b", "qwen3:13b", "Qwen3 13B"):
        found = match_model(name)
        assert (found.model_id, found.source) == ("Qwen/Qwen3-13B", "cache"), name
        assert _parsed(name)[0] == "Qwen/Qwen3-13B"
        profile = resolve_model(name)
        assert profile.source == "cache" and profile.num_layers == 40
    with pytest.raises(UnknownModelError):
        match_model("qwen3-11b")  # the cache holds 13B only


def test_structured_catalog_fields_are_used_when_present() -> None:
    from types import SimpleNamespace

    from aegis.models.resolve import _known_of

    entry = SimpleNamespace(id="acme/Foo-Chat", aliases=(), family="foo-2", size="7b", variant="instruct")
    known = _known_of(entry)
    assert known.group == "foo 2"
    assert [(n.family, n.version, str(n.size)) for n in known.full] == [("foo", None, "None"), ("foo", "2", "7B")]


SOLE = [m for m in catalog.models() if m.sole_size]


@pytest.mark.parametrize("entry", SOLE, ids=[m.id for m in SOLE])
def test_a_line_released_in_one_size_is_named_by_the_line_alone(entry) -> None:
    """'mistral-nemo' is Mistral-Nemo-Base-2407: the catalog row cites that the line has this one size; the
    catalog holds no other size of it, and a size the line does not have is still refused."""
    assert [m.id for m in catalog.models() if m.family == entry.family] == [entry.id]
    assert match_model(entry.family).model_id == entry.id
    assert match_model(f"{entry.family}-instruct").model_id == entry.id
    with pytest.raises(UnknownModelError) as refused:
        match_model(f"{entry.family}-99b")
    message = str(refused.value)  # the one size it has, and the model first among the suggestions
    assert f"is bundled in {entry.size.upper()})" in message
    assert message.split("did you mean ", 1)[1].startswith(entry.id)


@pytest.mark.parametrize("line", ["granite-3.3", "yi-1.5", "olmo-2", "gpt-oss", "qwen3", "gemma-3"])
def test_a_line_without_a_cited_single_size_needs_its_size(line: str) -> None:
    """One bundled size is not one released size (Granite 3.3 also has a 2B): the line alone is refused."""
    with pytest.raises(UnknownModelError, match="is bundled in"):
        match_model(line)


# ------------------------------------------------------------------------------ random names


def _catalog_families() -> dict[tuple[str, str | None], set[float]]:
    """(family word, version) of every bundled model named '<family>[-]<version>-<size>', with every size the
    catalog names for that family word (ids, aliases and structured fields), in parameters."""
    families: dict[tuple[str, str | None], set[float]] = {}
    sizes: dict[str, set[float]] = {}
    for m in catalog.models():
        names = [m.id.split("/", 1)[-1], *m.aliases, str(getattr(m, "size", "") or "")]
        head = re.match(r"^([a-z]+)-?(\d+(?:\.\d+)?)?-\d", m.id.split("/", 1)[-1].lower())
        if head is None:
            continue
        word = head.group(1)
        families.setdefault((word, head.group(2)), set())
        for name in names:
            for num, unit in re.findall(r"(\d+(?:\.\d+)?)([bm])(?![a-z])", name.lower()):
                sizes.setdefault(word, set()).add(float(num) * (1e9 if unit == "b" else 1e6))
    return {key: sizes.get(key[0], set()) for key in families}


FAMILIES = _catalog_families()


@st.composite
def _unbundled_names(draw) -> str:
    """'<family><version>-<size>' in the spellings people type, with a size the catalog has not for that family."""
    (word, version), taken = draw(st.sampled_from(sorted(FAMILIES.items(), key=str)))
    billions = draw(st.one_of(st.integers(1, 480).map(float),
                              st.sampled_from([0.1, 0.25, 0.36, 0.6, 1.1, 1.7, 2.7, 3.8, 6.7, 10.7, 13.5])))
    if any(abs(billions * 1e9 - t) <= 0.01 * t for t in taken):
        billions += 0.3 if billions < 20 else 1.0
    if any(abs(billions * 1e9 - t) <= 0.01 * t for t in taken):
        return draw(st.nothing())
    size = draw(st.sampled_from([f"{billions:g}b", f"{billions:g}B"] + ([f"{billions * 1e3:g}m"] if billions < 1 else [])))
    fam = draw(st.sampled_from([word, word.capitalize(), word.upper()]))
    if version:
        fam += draw(st.sampled_from(["", "-", " "])) + version
    if draw(st.booleans()):
        return f"{fam}:{size}"  # Ollama
    suffix = draw(st.sampled_from(["", "-Instruct", "-it", "-chat", " instruct"]))
    return fam + draw(st.sampled_from(["-", " ", "_"])) + size + suffix


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.filter_too_much])
@given(_unbundled_names())
def test_unbundled_family_sizes_never_resolve_to_another_size(name: str) -> None:
    with pytest.raises(UnknownModelError):
        resolve_model(name)
    model, issue = _parsed(name)
    assert model is None and issue is not None and "config.json" in issue, (name, model)


# ------------------------------------------------------------------------------------------ chat


def test_chat_answers_an_unknown_model_with_the_one_line_error_not_a_plan(tmp_path: Path) -> None:
    from aegis.schema import PlanRequest
    from aegis_agent import AgentSettings, ChatAgent, RequestExtractor, understand
    from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    asked: list[str] = []

    def substitute(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:  # an LLM that would guess
        asked.append("llm")
        args = {"model": "google/gemma-3-4b-pt", "method": "lora", "gpu": "h100"}
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args)])

    extractor = RequestExtractor(FunctionModel(substitute))
    text = "how much memory would gemma-3-19b need for lora on an h100?"
    error = _parsed("gemma-3-19b")[1]
    with ChatAgent(AgentSettings(runs_dir=str(tmp_path)), extractor=extractor) as agent:
        reply = agent.reply(text, "c")
    assert reply.tool_calls == () and reply.report is None and asked == []
    assert reply.text == error and "\n" not in reply.text

    previous = PlanRequest(model=LLAMA8, method="qlora", gpu="rtx-3090")
    for follow_up in ("which gpus fit qwen3-13b?", "what about mistral nemo 19b?", "explain gemma-3-19b"):
        u = understand(follow_up, request=previous, extractor=extractor)
        assert u.call is None and u.reply and "unknown model" in u.reply and "\n" not in u.reply, follow_up
    assert asked == []


def test_a_model_the_llm_names_is_read_by_the_same_decision() -> None:
    from aegis_agent import RequestExtractor, understand
    from pydantic_ai.models.test import TestModel

    unknown = RequestExtractor(TestModel(custom_output_args={"model": "qwen3-13b", "gpu": "h100"}))
    u = understand("I'd like to teach a small qwen to write SQL", extractor=unknown)
    with pytest.raises(UnknownModelError) as err:
        match_model("qwen3-13b")
    assert u.call is None and u.reply == str(err.value)
    sibling = RequestExtractor(TestModel(custom_output_args={"model": "Qwen2.5-7B-Instruct", "gpu": "h100"}))
    u = understand("I'd like to teach a small qwen to write SQL", extractor=sibling)
    assert u.call is not None and u.call.args["model"] == match_model("Qwen2.5-7B-Instruct").model_id


def test_the_report_names_the_config_used_for_a_sibling_variant():
    import aegis

    report = aegis.plan("lora Qwen2.5-Coder-7B-Instruct on h100")
    # planned with the base's identical config.json, said so; the request keeps the instruct repo (its weights)
    assert report.model.model_id == "Qwen/Qwen2.5-Coder-7B" and report.request.model == "Qwen/Qwen2.5-Coder-7B-Instruct"
    assert any("config used for Qwen/Qwen2.5-Coder-7B-Instruct" in n for n in report.notes)
    assert not any("config used" in n for n in aegis.plan("lora qwen2.5-coder-7b on h100").notes)


def test_a_repository_under_a_renamed_organisation_is_said_to_be_one():
    """Cohere For AI became Cohere Labs: CohereLabs/aya-23-8B is the bundled CohereForAI/aya-23-8B's repository, not
    an instruct/base sibling; the weights a run trains stay the ones asked for."""
    found = match_model("CohereLabs/aya-23-8B")
    assert found.model_id == "CohereForAI/aya-23-8B" and found.weights_id == "CohereLabs/aya-23-8B"
    assert "another organisation's name" in found.note and "sibling" not in found.note
    assert parse_request_lenient("lora CohereLabs/aya-23-8B on h100").request.model in (found.model_id, found.weights_id)


@pytest.mark.parametrize(("repo", "model"), [
    ("unsloth/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-3B-Instruct"),
    ("unsloth/Qwen3-8B", "Qwen/Qwen3-8B"),
    ("NousResearch/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B"),  # listed as sharing the base's file
])
def test_a_copy_under_another_organisation_is_planned_with_the_bundled_repositorys_config(repo, model):
    """A re-upload keeps its repository's name (unsloth/, NousResearch/): offline it is planned with the bundled
    config of that name, the note says so, and a run still downloads the copy's weights."""
    import aegis

    found = match_model(repo)
    assert (found.model_id, found.source, found.weights_id) == (model, "catalog", repo)
    assert "another organisation's name" in found.note and f"config used for {repo}" in found.note
    assert parse_request_lenient(f"lora {repo} on h100").request.model == repo
    report = aegis.plan(f"qlora {repo} on a100")
    assert any(f"config used for {repo}" in n for n in report.notes)


@pytest.mark.parametrize("repo", ["unsloth/llama-3-8b-bnb-4bit", "acme/Llama-3.2-3B-Instruct-v2",
                                  "acme/Qwen3-8B-Instruct-merged"])
def test_a_repository_named_otherwise_stays_a_hub_id(repo):
    """Only the exact repository name is a copy: a pre-quantised packing or a renamed fine-tune is its own model."""
    found = match_model(repo)
    assert (found.model_id, found.source) == (repo, "hub")


@pytest.mark.parametrize(("name", "model"), [
    ("granite3-dense:2b", "ibm-granite/granite-3.0-2b-base"), ("granite3-dense:8b", "ibm-granite/granite-3.0-8b-base"),
    ("granite3-moe:3b", "ibm-granite/granite-3.0-3b-a800m-base"), ("granite3-moe:1b", "ibm-granite/granite-3.0-1b-a400m-instruct"),
    ("granite-3-8b", "ibm-granite/granite-3.0-8b-base"),
])
def test_a_release_x_0_is_named_x_as_ollama_does(name, model):
    """Ollama's granite3-dense / granite3-moe are Granite 3.0: version 3 is 3.0, never 3.1."""
    assert match_model(name).model_id == model
    assert parse_request_lenient(f"lora {name} on h100").request.model in (model, match_model(name).weights_id)


@pytest.mark.parametrize(("name", "model"), [
    ("llama3.1:8b-text-q4_0", "meta-llama/Llama-3.1-8B"), ("gemma2:9b-text", "google/gemma-2-9b"),
    ("mixtral:8x7b-text-v0.1-q4_0", "mistralai/Mixtral-8x7B-v0.1"), ("gemma:2b-text", "google/gemma-2b"),
])
def test_ollamas_text_tag_is_the_pretrained_model(name, model):
    """Ollama tags the pre-trained (base) model 'text'; the word names no model outside a tag."""
    found = match_model(name)
    assert found.model_id == model and found.weights_id == model
    assert parse_request_lenient(f"lora {name} on h100").request.model == model


def test_text_outside_an_ollama_tag_is_a_word_of_the_name():
    with pytest.raises(UnknownModelError):
        match_model("llama-3.1-8b-text-adventure")


@pytest.mark.parametrize(("name", "config", "weights"), [
    ("olmo2:7b-instruct", "allenai/OLMo-2-1124-7B", "allenai/OLMo-2-1124-7B-Instruct"),  # the release word left out
    ("olmo2:1b-instruct", "allenai/OLMo-2-0425-1B", "allenai/OLMo-2-0425-1B-Instruct"),
    ("olmo2:7b-1124-instruct-q4_K_M", "allenai/OLMo-2-1124-7B", "allenai/OLMo-2-1124-7B-Instruct"),
    ("mistral-nemo:12b-instruct", "mistralai/Mistral-Nemo-Base-2407", "mistralai/Mistral-Nemo-Instruct-2407"),
    ("mistral-nemo-instruct", "mistralai/Mistral-Nemo-Base-2407", "mistralai/Mistral-Nemo-Instruct-2407"),
    ("olmo2:7b", "allenai/OLMo-2-1124-7B", "allenai/OLMo-2-1124-7B"),
    ("olmo-2-1124-7b-sft", "allenai/OLMo-2-1124-7B", "allenai/OLMo-2-1124-7B-SFT"),
    ("olmo-7b-instruct", "allenai/OLMo-7B-hf", "allenai/OLMo-7B-Instruct-hf"),  # a stem alias of the listed id
    ("mistral-nemo", "mistralai/Mistral-Nemo-Base-2407", "mistralai/Mistral-Nemo-Base-2407"),  # no suffix: the entry
])
def test_an_instruct_name_trains_the_listed_instruct_checkpoint(name, config, weights):
    """A name asking for the instruct model of an entry that lists it as sharing the base's config is planned with
    that config and trains the listed instruct weights, though the name leaves out the release ('1124') or the
    listed id its size ('Mistral-Nemo-Instruct-2407')."""
    found = match_model(name)
    assert (found.model_id, found.weights_id) == (config, weights)
    assert parse_request_lenient(f"lora {name} on h100").request.model == weights


def test_version_3_is_not_3_1():
    with pytest.raises(UnknownModelError):
        match_model("granite3-dense:3b")  # Granite 3.0 dense is 2B and 8B


@pytest.mark.parametrize(("name", "model", "said"), [
    ("llama-3.1-8b-instuct", "meta-llama/Llama-3.1-8B-Instruct", "spelling of 'instuct' corrected"),
    ("Qwen2.5-7B-Instrcut", "Qwen/Qwen2.5-7B-Instruct", "spelling of 'instrcut' corrected"),
    ("yi:34b-v1.5", "01-ai/Yi-1.5-34B", "Ollama's v1.5 tag is the version"),
    ("yi:34b-chat-v1.5-q4_0", "01-ai/Yi-1.5-34B-Chat", "Ollama's v1.5 tag is the version"),
    ("yi:9b-v1.5", "01-ai/Yi-1.5-9B", "Ollama's v1.5 tag is the version"),
    ("yi:9b-chat-v1.5-q4_0", "01-ai/Yi-1.5-9B-Chat", "Ollama's v1.5 tag is the version"),
    ("yi:6b-chat-v1.5-q4_0", "01-ai/Yi-1.5-6B-Chat", "Ollama's v1.5 tag is the version"),
    # Ollama's 'qwen' and 'codeqwen' are Qwen1.5 and CodeQwen1.5: their tags say so
    ("qwen:7b-chat-v1.5-q4_0", "Qwen/Qwen1.5-7B-Chat", "Ollama's v1.5 tag is the version"),
    ("qwen:110b-chat-v1.5-q4_K_M", "Qwen/Qwen1.5-110B-Chat", "Ollama's v1.5 tag is the version"),
    ("codeqwen:7b-chat-v1.5-q4_0", "Qwen/CodeQwen1.5-7B-Chat", "Ollama's v1.5 tag is the version"),
])
def test_an_instruct_slip_and_an_ollama_version_tag_are_read_within_family_and_size(name, model, said) -> None:
    found = match_model(name)
    assert found.model_id == model and said in found.note
    assert parse_request_lenient(f"lora {name} on h100").request.model in (model, found.weights_id)


@pytest.mark.parametrize("name", ["qwen2.5-8b-instuct", "llama-3.1-13b-instuct", "yi:13b-v1.5", "qwen2.5-7b-construct",
                                  "mistral:7b-v0.9"])
def test_a_slip_never_moves_a_name_to_another_size_or_version(name) -> None:
    with pytest.raises(UnknownModelError):
        match_model(name)


def test_a_version_alone_asks_which_model_of_it() -> None:
    with pytest.raises(UnknownModelError) as err:
        match_model("phi3.5")
    assert "which phi 3.5?" in str(err.value) and "mini" in str(err.value) and "moe" in str(err.value)
    assert "no bundled phi 3.5" not in str(err.value)


def test_a_name_without_a_suffix_read_as_an_instruct_entry_says_whose_weights_a_run_trains() -> None:
    """'granite-3.2-8b' names the bundled granite-3.2-8b-instruct config (no base of 3.2 is bundled): the note says
    the run trains those weights and how to name the base. A sibling's Hub id plans with the bundled shapes, says
    so, and keeps its own weights, where the line's bundled instruct/base pairs share their shapes (Gemma 3); in a
    line where they do not (Granite: instruct adds tokens), it is read from the Hub."""
    found = match_model("granite-3.2-8b")
    assert found.model_id == "ibm-granite/granite-3.2-8b-instruct" and found.weights_id == found.model_id
    assert "a run trains its weights" in found.note and "base checkpoint's Hub id" in found.note
    base = match_model("google/gemma-3-12b-pt")
    assert base.model_id == "google/gemma-3-12b-it" and base.weights_id == "google/gemma-3-12b-pt"
    assert "config used for" in base.note
    assert match_model("ibm-granite/granite-3.2-8b-base").source == "hub"
    assert match_model("qwen2.5-7b").note == "" and match_model("Qwen/Qwen2.5-7B-Instruct").note == ""


@pytest.mark.parametrize("name", ["granite-3.1-8b-instruct", "granite-3.2-8b-base", "granite-3.1-3b-a800m-instruct",
                                  "granite3.1-moe:3b-instruct"])
def test_a_sibling_whose_line_changes_shapes_between_instruct_and_base_is_refused(name) -> None:
    """Granite's instruct checkpoints have 3 more vocabulary rows than their bases (both bundled for 3.0 8B, read
    from their config.json files here): an instruct name is not planned with a bundled base's shapes, nor the other
    way round; the error says why and what to pass."""
    cfg = {i: catalog.read_model_config(catalog.model_entry(i)) for i in
           ("ibm-granite/granite-3.0-8b-instruct", "ibm-granite/granite-3.0-8b-base")}
    assert cfg["ibm-granite/granite-3.0-8b-instruct"]["vocab_size"] != cfg["ibm-granite/granite-3.0-8b-base"]["vocab_size"]
    with pytest.raises(UnknownModelError, match="does not share its layer shapes.*vocab_size.*config.json"):
        match_model(name)
    model, issue = _parsed(name)  # the parser gives the same answer
    assert model is None and "does not share its layer shapes" in issue


@pytest.mark.parametrize("repo", ["ibm-granite/granite-3.1-8b-instruct", "ibm-granite/granite-3.0-2b-instruct"])
def test_a_granite_instruct_hub_id_reads_its_own_config(repo) -> None:
    """Named by its Hub id, a Granite instruct checkpoint whose base alone is bundled is its own model, read from
    the Hub (offline: the one-line error that says to connect once), not its base's shapes."""
    found = match_model(repo)
    assert (found.model_id, found.source) == (repo, "hub")


@pytest.mark.parametrize(("name", "model_id"), [
    # the first Yi release: the base checkpoints are bundled now, so the bare name is the base
    ("yi-34b", "01-ai/Yi-34B"), ("yi:34b", "01-ai/Yi-34B"), ("01-ai/Yi-34B", "01-ai/Yi-34B"),
    ("yi-34b-chat", "01-ai/Yi-34B-Chat"), ("yi:6b", "01-ai/Yi-6B"), ("01-ai/Yi-6B", "01-ai/Yi-6B"),
    ("yi-6b-200k", "01-ai/Yi-6B-200K"), ("yi-34b-200k", "01-ai/Yi-34B-200K"), ("yi-9b-200k", "01-ai/Yi-9B-200K"),
    # Yi-1.5 9B and its chat/long-context checkpoints, each its own Hub file
    ("yi-1.5-9b", "01-ai/Yi-1.5-9B"), ("yi1.5:9b", "01-ai/Yi-1.5-9B"),
    ("yi-1.5-9b-chat", "01-ai/Yi-1.5-9B-Chat"), ("01-ai/Yi-1.5-9B-Chat", "01-ai/Yi-1.5-9B-Chat"),
    ("yi-1.5-9b-chat-16k", "01-ai/Yi-1.5-9B-Chat-16K"), ("yi-1.5-9b-32k", "01-ai/Yi-1.5-9B-32K"),
    # the -Chat name is the -Chat checkpoint, never the -Chat-16K one (whose stem it is)
    ("yi-1.5-34b-chat", "01-ai/Yi-1.5-34B-Chat"), ("yi-1.5-34b-chat-16k", "01-ai/Yi-1.5-34B-Chat-16K"),
    # Qwen2 bases beside the -Instruct entries
    ("qwen2-7b", "Qwen/Qwen2-7B"), ("qwen2:7b", "Qwen/Qwen2-7B"), ("qwen2-7b-instruct", "Qwen/Qwen2-7B-Instruct"),
    ("qwen2:0.5b", "Qwen/Qwen2-0.5B"), ("qwen2-1.5b-instruct", "Qwen/Qwen2-1.5B-Instruct"),
    # Granite 3.x: the bare name is the -base checkpoint where one is bundled
    ("granite-3.0-8b", "ibm-granite/granite-3.0-8b-base"), ("granite-3.0-8b-instruct", "ibm-granite/granite-3.0-8b-instruct"),
    ("granite-3.0-2b", "ibm-granite/granite-3.0-2b-base"), ("granite-3.1-8b", "ibm-granite/granite-3.1-8b-base"),
    ("granite3.1:8b", "ibm-granite/granite-3.1-8b-base"), ("granite-3.2-8b-instruct", "ibm-granite/granite-3.2-8b-instruct"),
    ("granite3.1-moe:3b", "ibm-granite/granite-3.1-3b-a800m-base"),
    ("granite-3.0-3b-a800m", "ibm-granite/granite-3.0-3b-a800m-base"),
    # Ollama's -dense line of a release that has a -moe line too
    ("granite3.1-dense:8b", "ibm-granite/granite-3.1-8b-base"), ("granite3.0-dense:2b", "ibm-granite/granite-3.0-2b-base"),
    ("granite-3.0-dense-8b", "ibm-granite/granite-3.0-8b-base"),
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct", "Qwen/Qwen3-Coder-480B-A35B-Instruct"),
])
def test_the_new_yi_qwen2_granite_checkpoints_resolve_to_their_own_configs(name, model_id) -> None:
    found = match_model(name)
    assert found.model_id == model_id and found.weights_id == model_id and found.note == "", found
    assert parse_request_lenient(f"lora {name} on h100").request.model == model_id


_DS = "deepseek-ai/deepseek"


@pytest.mark.parametrize(("name", "model_id"), [
    # DeepSeek-Coder 1.3B / 6.7B / 33B: Hub ids, names, Ollama's deepseek-coder:<size>; the bare name is the base
    (f"{_DS}-coder-6.7b-instruct", f"{_DS}-coder-6.7b-instruct"),
    ("deepseek-coder-6.7b-instruct", f"{_DS}-coder-6.7b-instruct"),
    ("deepseek-coder:6.7b", f"{_DS}-coder-6.7b-base"), ("deepseek-coder-6.7b", f"{_DS}-coder-6.7b-base"),
    ("deepseek-coder:1.3b", f"{_DS}-coder-1.3b-base"), ("deepseek-coder:33b", f"{_DS}-coder-33b-base"),
    ("deepseek-coder:33b-instruct", f"{_DS}-coder-33b-instruct"),
    ("deepseek-coder:6.7b-instruct-q4_K_M", f"{_DS}-coder-6.7b-instruct"),
    # DeepSeek-Coder-v1.5 7B (continued from DeepSeek LLM 7B): its own line, named with its version
    ("deepseek-coder-v1.5:7b", f"{_DS}-coder-7b-base-v1.5"),
    ("deepseek-coder-7b-instruct-v1.5", f"{_DS}-coder-7b-instruct-v1.5"),
    ("deepseek-coder-v1.5-7b-instruct", f"{_DS}-coder-7b-instruct-v1.5"),
    # DeepSeek LLM and DeepSeekMath (-rl is its own checkpoint, not -instruct's)
    ("deepseek-llm:7b", f"{_DS}-llm-7b-base"), ("deepseek-llm:67b", f"{_DS}-llm-67b-base"),
    ("deepseek-llm-67b-chat", f"{_DS}-llm-67b-chat"), ("deepseek-math:7b", f"{_DS}-math-7b-base"),
    ("deepseek-math-7b-instruct", f"{_DS}-math-7b-instruct"), ("deepseek-math-7b-rl", f"{_DS}-math-7b-rl"),
    # Qwen1.5, its MoE and CodeQwen1.5: base before -Chat
    ("qwen1.5:0.5b", "Qwen/Qwen1.5-0.5B"), ("qwen1.5-500m", "Qwen/Qwen1.5-0.5B"), ("qwen1.5-1.8b", "Qwen/Qwen1.5-1.8B"),
    ("qwen1.5:7b", "Qwen/Qwen1.5-7B"), ("qwen-1.5-72b", "Qwen/Qwen1.5-72B"), ("qwen1.5:110b", "Qwen/Qwen1.5-110B"),
    ("Qwen1.5-32B-Chat", "Qwen/Qwen1.5-32B-Chat"), ("qwen1.5-14b-chat", "Qwen/Qwen1.5-14B-Chat"),
    ("Qwen/Qwen1.5-4B-Chat", "Qwen/Qwen1.5-4B-Chat"), ("qwen1.5-moe:a2.7b", "Qwen/Qwen1.5-MoE-A2.7B"),
    ("qwen1.5-moe-a2.7b-chat", "Qwen/Qwen1.5-MoE-A2.7B-Chat"), ("codeqwen1.5:7b", "Qwen/CodeQwen1.5-7B"),
    ("codeqwen1.5-7b-chat", "Qwen/CodeQwen1.5-7B-Chat"),
    # Qwen2-57B-A14B-Instruct and Yi-1.5 6B-Chat / 34B-32K beside their bases
    ("qwen2-57b-a14b-instruct", "Qwen/Qwen2-57B-A14B-Instruct"), ("qwen2:57b", "Qwen/Qwen2-57B-A14B"),
    ("yi-1.5-6b-chat", "01-ai/Yi-1.5-6B-Chat"), ("yi1.5:6b", "01-ai/Yi-1.5-6B"),
    ("yi-1.5-34b-32k", "01-ai/Yi-1.5-34B-32K"),
    # Zephyr and Vicuna: their own Hub files, not their base models'
    ("zephyr-7b-beta", "HuggingFaceH4/zephyr-7b-beta"), ("zephyr:7b", "HuggingFaceH4/zephyr-7b-beta"),
    ("HuggingFaceH4/zephyr-7b-beta", "HuggingFaceH4/zephyr-7b-beta"),
    ("vicuna-7b-v1.5", "lmsys/vicuna-7b-v1.5"), ("vicuna:7b", "lmsys/vicuna-7b-v1.5"),
    ("lmsys/vicuna-7b-v1.5", "lmsys/vicuna-7b-v1.5"),
])
def test_checkpoints_resolve_to_their_own_configs(name, model_id) -> None:
    found = match_model(name)
    assert found.model_id == model_id and found.weights_id == model_id and found.note == "", found
    assert parse_request_lenient(f"lora {name} on h100").request.model == model_id


@pytest.mark.parametrize("name", [
    "deepseek-coder-7b", "deepseek-coder:7b",  # the 6.7B, or Coder-v1.5 7B (another line): the name says neither
    "deepseek-coder-v1.5:6.7b", "deepseek-coder-13b", "deepseek-llm-13b", "deepseek-math:6.7b",
    "qwen1.5-3b", "qwen1.5:8b", "codeqwen1.5-14b", "yi-1.5-6b-chat-16k",
    "qwen:7b", "qwen-14b",  # no release: 'Qwen-7B' and 'Qwen-14B' are also the first Qwen's Hub names
    "granite3.1-dense:2b",  # the -dense line names only the sizes bundled: Granite 3.1 2B is not
    "granite3.2-dense:8b", "qwen2.5-dense:7b",  # '-dense' only where the release has a -moe line too
])
def test_neighbouring_sizes_and_release_less_names_of_the_new_lines_are_refused(name) -> None:
    with pytest.raises(UnknownModelError) as err:
        match_model(name)
    model, issue = _parsed(name)
    assert model is None and issue == str(err.value) and "config.json" in issue


def test_a_variant_word_of_a_new_line_is_its_instruct_checkpoint_and_says_so() -> None:
    """DeepSeek-Coder's -instruct and -base keep each other's layer shapes (both bundled): 'deepseek-coder-6.7b-chat'
    is the -instruct checkpoint, planned with its own config, and the note says how the name was read."""
    found = match_model("deepseek-coder-6.7b-chat")
    assert found.model_id == f"{_DS}-coder-6.7b-instruct" and found.note.startswith(f"{found.model_id} (config used for")
    assert match_model("qwen1.5-7b-instruct").model_id == "Qwen/Qwen1.5-7B-Chat"


def test_qwen3_coder_480b_by_its_ollama_name() -> None:
    """Only the -Instruct checkpoint is published: the name without a suffix is it, and says so."""
    for name in ("qwen3-coder:480b", "qwen3-coder-480b-a35b"):
        found = match_model(name)
        assert found.model_id == found.weights_id == "Qwen/Qwen3-Coder-480B-A35B-Instruct"
        assert "a run trains its weights" in found.note
    assert match_model("qwen3-coder:30b").model_id == "Qwen/Qwen3-Coder-30B-A3B-Instruct"


def test_the_report_says_how_a_name_was_read() -> None:
    import aegis

    report = aegis.plan("lora llama-3.1-8b-instuct on a100")
    assert report.model.model_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert any("spelling of 'instuct' corrected" in n for n in report.notes)
    sibling = aegis.plan("lora Qwen2.5-Coder-7B-Instruct on h100")
    assert sum("config used for" in n for n in sibling.notes) == 1  # said once, for the id the report plans


def test_a_size_two_bundled_models_share_asks_which_one() -> None:
    """'mistral-small-24b' is Mistral Small 3 (2501) or 3.1 (2503): both are bundled, the name picks neither."""
    for name in ("mistral-small-24b", "mistral-small:24b"):
        with pytest.raises(UnknownModelError) as err:
            match_model(name)
        text = str(err.value)
        assert "which mistral small 24B?" in text and "did you mean" in text
        assert "Mistral-Small-24B-Instruct-2501" in text and "Mistral-Small-3.1-24B-Instruct-2503" in text
    assert match_model("mistral-small:24b-instruct-2501-q4_K_M").model_id == "mistralai/Mistral-Small-24B-Instruct-2501"


@pytest.mark.parametrize("name", ["deepseek-coder-v2:16b", "starcoder-v2:7b", "foo-v1:7b", "yi-v1.5:9b"])
def test_a_version_tag_in_the_name_itself_is_not_rewritten(name) -> None:
    """Only a tag after the Ollama size is read as the version; one before the colon is the model's own name
    (this once recursed without end)."""
    with pytest.raises(UnknownModelError):
        match_model(name)


def test_a_line_name_without_a_size_asks_which_size() -> None:
    with pytest.raises(UnknownModelError) as err:
        match_model("gpt-oss")
    assert "which gpt oss?" in str(err.value) and "gpt-oss-20b" in str(err.value) and "gpt-oss-120b" in str(err.value)


def test_a_variant_of_a_listed_id_trains_that_ids_weights() -> None:
    """DeepSeek-R1 shares DeepSeek-V3's config: 'deepseek-r1-chat' is planned with it and trains R1's weights."""
    found = match_model("deepseek-r1-chat")
    assert found.model_id == "deepseek-ai/DeepSeek-V3" and found.weights_id == "deepseek-ai/DeepSeek-R1"
    assert match_model("deepseek-v3-chat").weights_id == "deepseek-ai/DeepSeek-V3"
    assert match_model("olmo-3-7b-think").weights_id == "allenai/Olmo-3-7B-Think"


@pytest.mark.parametrize("name", [
    "zephyr", "zephyr-7b-alpha",  # another checkpoint of the line (its file is not bundled)
    "vicuna:13b", "vicuna-7b-v1.3", "vicuna",  # another size; v1.3 is LLaMA 1 (2,048 positions)
])
def test_other_zephyr_and_vicuna_checkpoints_are_refused(name) -> None:
    with pytest.raises(UnknownModelError) as err:
        match_model(name)
    model, issue = _parsed(name)
    assert model is None and issue == str(err.value) and "config.json" in issue
