"""JSONL logs survive torn writes and concurrent appenders."""

import multiprocessing as mp

from aegis.supervise.events import EventLog, append_jsonl, read_jsonl


def test_torn_tail_is_skipped_and_healed(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.append("a", 1, x=1)
    with open(path, "ab") as f:
        f.write(b'{"time": 1, "kind": "half')  # a kill -9 mid-write
    assert [e.kind for e in log.read()] == ["a"]
    log.append("b", 2)
    assert [e.kind for e in log.read()] == ["a", "b"]
    assert [e.step for e in log.read()] == [1, 2]


def _writer(path, n, tag):
    for i in range(n):
        append_jsonl(path, {"tag": tag, "i": i, "pad": "x" * 200})


def test_concurrent_appenders_never_interleave(tmp_path):
    path = tmp_path / "inbox.jsonl"
    procs = [mp.get_context("spawn").Process(target=_writer, args=(path, 50, t)) for t in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    recs = read_jsonl(path)
    assert len(recs) == 100
    assert sorted(r["i"] for r in recs if r["tag"] == "a") == list(range(50))
