"""Data problems are counted the same way by the plan and by the run, and cited by line.

One messy file, written here so the test knows every bad line: corrupt lines, rows without the format's
fields, an empty row, a row without an assistant turn, two rows longer than seq_len (one keeps an answer
within it, one does not). The plan (``analyze_dataset``) and the run's loader (``train.data.load_examples``)
must both find exactly those lines, as JSON Lines and as CSV. A tokenizer without a chat template is refused
by both (one decision, ``ChatRenderer.require_template``), or rendered with the given ``chat_template``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from aegis.data.profile import analyze_dataset
from aegis.data.reading import describe_problem, read_rows
from aegis.errors import DatasetError
from aegis.data.render import ChatRenderer
from aegis.train.data import load_examples
from tests.hf_folders import CHATML, corpus, make_tokenizer
from tests.demo_model import TINY_RUN

SEQ = 128
GOOD = 12


def _folder(path: Path, template: str | None) -> Path:
    """A model folder for planning and tokenising: a tiny llama config.json and a BPE tokenizer trained here."""
    tok = make_tokenizer(template)
    path.mkdir(parents=True)
    tok.save_pretrained(path)
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": len(tok), "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def chatml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _folder(tmp_path_factory.mktemp("m") / "chatml", CHATML)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _folder(tmp_path_factory.mktemp("m") / "bare", None)


def _chat(q: str, a: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


LONG = " ".join(corpus(40, seed=7))  # several hundred tokens: past SEQ

# (kind or None, the row as JSON Lines) in file order; None rows are good. Kinds are what the file says.
_ROWS: list[tuple[tuple[str, ...], str]] = [
    *[((), json.dumps({"messages": _chat(q, "the refund is on the card")})) for q in corpus(GOOD, seed=1)[:6]],
    (("corrupt",), '{"messages": [{"role": "user", "content": "cut off'),
    (("corrupt",), "[1, 2, 3]"),
    (("no_format",), json.dumps({"prompt": "a prompt column in a messages file"})),
    (("no_format",), json.dumps({"messages": "not a list"})),
    (("empty",), json.dumps({"messages": []})),
    (("no_assistant",), json.dumps({"messages": [{"role": "user", "content": "a question nobody answers"}]})),
    (("truncated",), json.dumps({"messages": _chat("short question", LONG)})),  # the answer starts within SEQ
    (("truncated", "no_targets"), json.dumps({"messages": _chat(LONG, "an answer past the cut")})),
    *[((), json.dumps({"messages": _chat(q, "please reset the password")})) for q in corpus(GOOD, seed=1)[6:]],
]


def _expected(first_line: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for n, (kinds, _) in enumerate(_ROWS, start=first_line):
        for kind in kinds:
            out.setdefault(kind, []).append(n)
    return out


def _write_jsonl(path: Path) -> dict[str, list[int]]:
    path.write_text("".join(line + "\n" for _, line in _ROWS))
    return _expected(1)


def _write_csv(path: Path) -> dict[str, list[int]]:
    """The same rows as CSV (header on line 1, a chat as a JSON string per cell); corrupt rows are records with
    the wrong number of fields, one of them an unclosed quote."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["messages", "source"])
        for kinds, line in _ROWS:
            if kinds == ("corrupt",):
                fh.write('"an unclosed quote,web\n' if line.startswith("[") else "one field only\n")
                continue
            row = json.loads(line)
            w.writerow([json.dumps(row["messages"]) if "messages" in row else "", "web"] if "prompt" not in row
                       else ["", row["prompt"]])
    return _expected(2)


def _kinds(problems) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for p in problems:
        out.setdefault(p.kind, []).append(p.line)
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_the_plan_and_the_run_count_the_same_rows_and_cite_the_same_lines(tmp_path, chatml, kind):
    path = tmp_path / f"messy.{kind}"
    expected = (_write_jsonl if kind == "jsonl" else _write_csv)(path)

    plan = analyze_dataset(str(path), model=str(chatml), seq_len=SEQ)
    examples, run = load_examples(str(path), ChatRenderer.from_folder(chatml), seq_len=SEQ)

    planned = {p.kind: list(p.lines) for p in plan.problems}
    assert planned == expected  # the reference: the lines this test wrote bad
    assert _kinds(run.problems) == expected
    trained = 2 * 6 + 1  # the good rows and the long answer, cut
    assert plan.num_rows == len(examples) == run.examples == trained
    assert list(plan.row_lengths) == run.lengths and plan.sampled_rows == run.rows
    assert {p.kind: p.count for p in plan.problems} == {k: len(v) for k, v in expected.items()}
    assert not any(p.sampled for p in plan.problems)
    # both say it the same way, one line per kind
    assert run.warnings() == [describe_problem(p.kind, p.count, p.lines, unit=p.unit, reason=p.reason, fmt=plan.format)
                              for p in plan.problems]
    assert run.warnings()[0].startswith("2 corrupt lines skipped: lines "
                                        f"{expected['corrupt'][0]}, {expected['corrupt'][1]} (first: ")


def test_overlong_drop_drops_the_same_rows_in_plan_and_run(tmp_path, chatml):
    path = tmp_path / "messy.jsonl"
    expected = _write_jsonl(path)
    plan = analyze_dataset(str(path), model=str(chatml), seq_len=SEQ, overlong="drop")
    examples, run = load_examples(str(path), ChatRenderer.from_folder(chatml), seq_len=SEQ, overlong="drop")
    overlong = {p.kind: list(p.lines) for p in plan.problems}["overlong"]
    assert overlong == _kinds(run.problems)["overlong"] == expected["truncated"]
    assert plan.num_rows == len(examples) == 2 * 6


def test_many_problems_are_all_counted_and_the_first_listed(tmp_path, chatml):
    good = json.dumps({"messages": _chat("q", "a")})
    lines = [good if i % 3 else "{broken" for i in range(60)]  # lines 1, 4, 7, ... are corrupt: 20 of them
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rows = read_rows(str(path))
    assert [p.line for p in rows.problems] == list(range(1, 61, 3)) and rows.num_rows == 40
    text = describe_problem("corrupt", 20, [p.line for p in rows.problems], reason=rows.problems[0].reason)
    assert text.startswith("20 corrupt lines skipped: lines 1, 4, 7, 10, 13, 16, 19, 22, 25, 28 and 10 more")
    plan = analyze_dataset(str(path), model=str(chatml))
    assert plan.num_rows == 40 and plan.problems[0].count == 20 and plan.rows_read == 60


def test_the_plan_report_lists_the_problems_by_line(tmp_path, chatml):
    from typer.testing import CliRunner

    from aegis.cli import app

    path = tmp_path / "messy.jsonl"
    expected = _write_jsonl(path)
    out = CliRunner().invoke(app, ["plan", "--model", str(chatml), "--gpu", "3090", "--method", "lora",
                                   "--dataset", str(path), "--seq", str(SEQ)], terminal_width=400)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())  # the report wraps at the console's width, which other tests may set
    assert f"({2 * 6 + 1} rows)" in text
    corrupt = ", ".join(map(str, expected["corrupt"]))
    assert f"2 corrupt lines skipped: lines {corrupt}" in text
    assert "without an assistant turn skipped: line " + str(expected["no_assistant"][0]) in text


# ------------------------------------------------------------------------------------ chat templates


def test_a_tokenizer_without_a_chat_template_is_refused_by_plan_and_run_alike(tmp_path, bare):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": _chat(q, "the refund is on the card")}) + "\n"
                            for q in corpus(8, seed=3)))
    with pytest.raises(DatasetError) as planned:
        analyze_dataset(str(path), model=str(bare))
    with pytest.raises(DatasetError) as ran:
        load_examples(str(path), ChatRenderer.from_folder(bare))
    for err in (planned.value, ran.value):
        assert "no chat template" in str(err) and "`chat_template:`" in str(err) and "\n" not in str(err)
    assert str(planned.value) == str(ran.value)


def test_a_given_chat_template_is_what_the_plan_renders_with(tmp_path, bare, chatml):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": _chat(q, "the refund is on the card")}) + "\n"
                            for q in corpus(8, seed=3)))
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    plan = analyze_dataset(str(path), model=str(bare), chat_template=str(template))
    _, run = load_examples(str(path), ChatRenderer.from_folder(bare, chat_template=str(template)))
    own = analyze_dataset(str(path), model=str(chatml))  # the same tokenizer with the template built in
    assert plan.tokenizer_exact and list(plan.row_lengths) == run.lengths == list(own.row_lengths)
    assert any("the given chat_template" in n for n in plan.notes)


def test_the_planner_refuses_a_folder_without_a_template_in_one_line(tmp_path, bare, capsys):
    from aegis.cli import main

    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": _chat("q", "a")}) + "\n")
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(bare), "--gpu", "3090", "--dataset", str(path)])
    said = capsys.readouterr()
    lines = [line for line in (said.err + said.out).splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and "no chat template" in lines[0] and "`chat_template:`" in lines[0]
    text = tmp_path / "text.jsonl"  # raw text needs no template: planned
    text.write_text(json.dumps({"text": "the refund is on the card"}) + "\n")
    assert analyze_dataset(str(text), model=str(bare)).format == "text"


# ------------------------------------------------------------------------------------------ the run


@pytest.mark.slow
def test_the_run_says_what_the_plan_said_live_in_its_events_and_in_its_summary(tmp_path, chatml, capsys):
    """`aegis run` on the messy file (the demo's tiny llama, byte tokens: the reader's problems do not depend on
    the tokenizer): one live line per kind of problem, the same in events.jsonl and after the outcome."""
    import yaml

    from aegis.cli import main

    path = tmp_path / "messy.jsonl"
    expected = _write_jsonl(path)
    plan = analyze_dataset(str(path), model=str(chatml), seq_len=SEQ)
    cfg = {**TINY_RUN, "data": str(path), "export": False,
           "train_config": {"method": "full", "micro_batch_size": 1, "seq_len": 256, "precision": "fp32"},
           "training": {"total_steps": 1, "steps_per_window": 1}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    main(["run", "--config", str(tmp_path / "run.yaml"), "--runs-dir", str(tmp_path / "runs"), "--run-id", "messy"])
    out = capsys.readouterr().out.replace("\n", " ")
    events = [json.loads(line) for line in (tmp_path / "runs" / "messy" / "events.jsonl").read_text().splitlines()]
    loaded = next(e["data"] for e in events if e["kind"] == "data_loaded")
    warnings = [e["data"]["message"] for e in events if e["kind"] == "data_warning"]
    read_kinds = ("corrupt", "no_format", "empty", "no_assistant")
    assert {k: v["lines"] for k, v in loaded["problems"].items() if k in read_kinds} == {k: expected[k] for k in read_kinds}
    planned = [describe_problem(p.kind, p.count, p.lines, unit=p.unit, reason=p.reason, fmt=plan.format)
               for p in plan.problems if p.kind in read_kinds]
    assert warnings[:len(planned)] == planned
    assert loaded["rows"] == 2 * 6 + 2 and loaded["problems"]["truncated"]["lines"] == expected["truncated"]
    assert out.count("2 corrupt lines skipped: lines 7, 8") == 2  # live, and in the summary after the outcome
    assert f"data: {loaded['examples']} examples trained from 14 rows" in out
