"""The status says what a run trains and where its result went: model and data from ``<run>/source.json`` (the
config before it exists), the export from the last ``exported`` event — in `aegis status`, and in the Markdown the
chat and Slack panels show."""

from __future__ import annotations

import json
from pathlib import Path

from aegis.supervise.run_config import RunConfig
from aegis.supervise.events import EventLog
from aegis.supervise.runs import RunPaths, write_json_atomic
from aegis.supervise.status import RunStatusReport, build_status, render_status, status_markdown
from rich.console import Console

from tests.demo_model import TINY_LLAMA, TINY_RUN, TOY_DATA


def _run(tmp_path: Path, **config: object) -> RunPaths:
    paths = RunPaths(tmp_path / "runs" / "r1")
    paths.root.mkdir(parents=True)
    cfg = RunConfig(run_id="r1", **config)
    paths.config.write_text(cfg.model_dump_json(by_alias=True))
    return paths


def _text(report: RunStatusReport) -> str:
    console = Console(record=True, width=200)
    console.print(render_status(report))
    return console.export_text()


def test_before_the_model_is_resolved_the_config_names_it(tmp_path: Path) -> None:
    folder, data = tmp_path / "my-model", tmp_path / "chats.jsonl"
    paths = _run(
        tmp_path,
        model=str(folder),
        data=str(data),
        train_config={"method": "lora", "micro_batch_size": 8, "seq_len": 64},
    )
    st = build_status(paths)
    assert (st.status, st.model, st.data) == ("starting", str(folder), str(data))
    assert (st.init, st.method) == ("pretrained", "lora")
    assert st.export_path is None and "export" not in _text(st)
    assert f"- Model `{folder}` (lora) on `{data}`" in status_markdown(st).splitlines()


def test_source_json_and_the_exported_event_are_shown(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "snapshots" / "abc"
    qlora = {"method": "qlora", "micro_batch_size": 4, "seq_len": 64}
    paths = _run(tmp_path, model="org/base", data="org/chats", train_config=qlora)
    write_json_atomic(
        paths.source,
        {"model": "org/base", "folder": str(snapshot), "hub_id": "org/base", "init": "pretrained", "data": "org/chats"},
    )
    log = EventLog(paths.events)
    log.append("exported", step=10, path=str(paths.root / "old-export"), merged=False, method="qlora")
    log.append("exported", step=20, path=str(paths.export), merged=False, method="qlora")
    st = build_status(paths)
    assert (st.model, st.data, st.init) == ("org/base", "org/chats", "pretrained")
    assert (st.export_path, st.export_kind) == (str(paths.export), "PEFT adapter")
    text = _text(st)
    for fragment in ("org/base (qlora)", "org/chats", f"{paths.export} (PEFT adapter)"):
        assert fragment in text
    md = status_markdown(st)
    assert "- Model `org/base` (qlora) on `org/chats`" in md and f"- Export (PEFT adapter): `{paths.export}`" in md


def test_a_local_folder_without_hub_id_and_a_merged_export(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    paths = _run(tmp_path, model=str(folder), data="toy")
    source = {"model": str(folder), "folder": str(folder), "hub_id": None, "data": "toy", "init": "pretrained"}
    write_json_atomic(paths.source, source)
    EventLog(paths.events).append("exported", step=5, path=str(paths.export), merged=True, method="lora")
    st = build_status(paths)
    assert st.model == str(folder) and st.export_kind == "HF model folder"


def test_the_demo_says_random_init(tmp_path: Path) -> None:
    paths = _run(tmp_path, **TINY_RUN, data=TOY_DATA)  # the demo's model folder (no weights) and data
    st = build_status(paths)
    assert (st.model, st.data, st.init) == (TINY_LLAMA, TOY_DATA, "random")
    assert f"{TINY_LLAMA} (full, random init)" in _text(st)
    write_json_atomic(paths.source, {"model": "llama", "folder": None, "hub_id": None, "init": "random", "data": "toy"})
    assert build_status(paths).model == TINY_LLAMA  # the config's name, not the config's model_type
    inline = _run(tmp_path / "inline", model={"model_type": "llama", "hidden_size": 8}, data="toy")
    assert build_status(inline).model == "inline llama config"


def test_a_torn_source_json_falls_back_to_the_config(tmp_path: Path) -> None:
    paths = _run(tmp_path, model="org/base", data="org/chats")
    paths.source.write_text('{"model": "org/')
    assert (build_status(paths).model, json.loads(paths.config.read_text())["model"]) == ("org/base", "org/base")
