"""Bad and odd inputs across every command: one line on stderr, the right exit code, never a traceback.

Each case is an `aegis` command line as a new user types it (free text with signs, units and huge numbers, flags out
of range, binary or empty files where YAML/JSON is expected, folders without config.json, unknown run ids). The
command runs through `aegis.cli.main`, the console script's entry point, so the CLI's last line of defence is part
of what is tested. Cases that must print a given fragment (the value and the accepted range) say so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aegis.cli import main

pytestmark = pytest.mark.filterwarnings("ignore")

BINARY = bytes(range(256)) * 4 + b"\xff\xfe\x00\x81"
M = "lora qwen2.5-0.5b"  # a small bundled model: plans in well under a second


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Odd files and folders the cases name as {key}."""
    root = tmp_path_factory.mktemp("bad")
    paths: dict[str, str] = {"root": str(root)}

    def write(name: str, data: str | bytes) -> str:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        paths[name.replace(".", "_").replace("/", "_")] = str(path)
        return str(path)

    write("binary.yaml", BINARY)
    write("binary.json", BINARY)
    write("binary.jsonl", BINARY)
    write("empty.yaml", "")
    write("list.yaml", "- a\n- b\n")
    write("broken.yaml", "merge_method: [slerp\nmodels:\n  - {")
    write("broken.json", "{not json")
    write("array.json", "[1, 2, 3]")
    write("empty.jsonl", "")
    write("nofolder/config.json", BINARY)
    write("badjson/config.json", "{\"model_type\": ")
    write("listjson/config.json", "[]")
    write("unknownarch/config.json", json.dumps({"model_type": "not-a-model", "hidden_size": 8}))
    write("negative/config.json", json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": -64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100,
        "max_position_embeddings": 128}))
    for name, change in {"hugelayers": {"num_hidden_layers": 10**9}, "nopositions": {"max_position_embeddings": 0},
                         "textsize": {"hidden_size": "64"}, "kvheads": {"num_key_value_heads": 8},
                         "kvheads3": {"num_key_value_heads": 3}}.items():
        write(f"{name}/config.json", json.dumps({
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100,
            "max_position_embeddings": 128, **change}))
    (root / "noconfig").mkdir()
    (root / "noconfig" / "weights.bin").write_bytes(b"\0" * 16)
    paths["noconfig"] = str(root / "noconfig")
    (root / "emptydir").mkdir()
    paths["emptydir"] = str(root / "emptydir")
    for name, params in {
        "slerp_t": "parameters: {t: 7.5}",
        "slerp_t_neg": "parameters: {t: -0.1}",
        "slerp_t_grad": "parameters: {t: [0, 0.5, 3]}",
        "slerp_t_nan": "parameters: {t: .nan}",
        "slerp_t_str": "parameters: {t: abc}",
    }.items():
        write(f"{name}.yml", f"merge_method: slerp\nbase_model: {root}/a\nmodels:\n  - model: {root}/a\n"
                             f"  - model: {root}/b\n{params}\n")
    write("ties_density.yml", f"merge_method: ties\nbase_model: {root}/a\nmodels:\n  - model: {root}/b\n"
                              "    parameters: {weight: 1.0, density: 0}\n")
    write("ties_density_big.yml", f"merge_method: ties\nbase_model: {root}/a\nmodels:\n  - model: {root}/b\n"
                                  "    parameters: {weight: 1.0, density: 1.5}\n")
    write("linear_weight_inf.yml", f"merge_method: linear\nmodels:\n  - model: {root}/a\n    parameters: {{weight: .inf}}\n"
                                   f"  - model: {root}/b\n    parameters: {{weight: 1}}\n")
    write("ties_lambda_nan.yml", f"merge_method: ties\nbase_model: {root}/a\nmodels:\n  - model: {root}/b\n"
                                 "    parameters: {weight: 1.0}\nparameters: {lambda: .nan}\n")
    write("layer_range.yml", f"merge_method: passthrough\nslices:\n  - sources:\n      - model: {root}/a\n"
                             "        layer_range: [4, -2]\n")
    write("evo_pop.yml", f"base_model: {root}/a\nmodels: [{root}/b, {root}/c]\neval_data: {root}/e.jsonl\npopulation: 3\n")
    write("evo_rate.yml", f"base_model: {root}/a\nmodels: [{root}/b, {root}/c]\neval_data: {root}/e.jsonl\n"
                          "mutation_rate: -1\n")
    write("evo_gens.yml", f"base_model: {root}/a\nmodels: [{root}/b, {root}/c]\neval_data: {root}/e.jsonl\n"
                          "generations: 1e99\n")
    write("run_unknown.yaml", "no_such_key: 1\n")
    write("run_inf_sigma.yaml", "model: tiny-llama\ndata: toy\nmonitoring: {spike_sigma: .inf}\n")
    write("run_nan_boost.yaml", "model: tiny-llama\ndata: toy\ncurriculum: {boost: .nan}\n")
    run_config = json.dumps({"model": "tiny-llama", "data": "x.jsonl"})
    write("runs/binconfig/config.json", BINARY)  # run folders whose own files were damaged
    write("runs/emptyconfig/config.json", "")
    write("runs/binevents/config.json", run_config)
    write("runs/binevents/events.jsonl", b'{"kind": "start"}\n' + BINARY + b"\n")
    write("runs/baddb/config.json", run_config)
    write("runs/baddb/supervisor.sqlite", BINARY)
    paths["runs"] = str(root / "runs")
    write("plan_bad.json", json.dumps({"request": {"model": 5}}))
    return paths


def _case(argv, code=2, says=(), id=None, one_line=True):
    """``one_line=False``: a library's progress lines may come before the error (still no traceback)."""
    return pytest.param(argv, code, tuple([says] if isinstance(says, str) else says), one_line, id=id)


CASES = [
    # ---- plan: free text -----------------------------------------------------------------------------------
    _case(["plan", f"{M} on 3090 bs -2"], 2, ["micro batch size -2", "from 1 to 65536"], id="text-negative-batch"),
    _case(["plan", f"{M} on -2x 3090"], 2, ["GPU count -2", "from 1 to 4096"], id="text-negative-gpus"),
    _case(["plan", f"{M} on 3090 seq 1000000000"], 2, ["sequence length 1000000000", "16777216"], id="text-huge-seq"),
    _case(["plan", f"{M} on 3090 seq 1e9"], 2, "sequence length", id="text-seq-exponent"),
    _case(["plan", f"{M} on 3090 seq 4kb"], 2, ["'4kb'", "unit"], id="text-seq-unit"),
    _case(["plan", f"{M} on 3090 seq -512"], 2, "sequence length -512", id="text-negative-seq"),
    _case(["plan", f"{M} on 3090 bs 0"], 2, "micro batch size 0", id="text-zero-batch"),
    _case(["plan", f"{M} on 0x 3090"], 2, "GPU count 0", id="text-zero-gpus"),
    _case(["plan", f"{M} on 1.5x 3090"], 2, ["GPU count 1.5", "whole number"], id="text-fraction-gpus"),
    _case(["plan", f"{M} on h100 x 100000"], 2, "GPU count 100000", id="text-many-gpus-after"),
    _case(["plan", f"{M} on 100000x h100"], 2, "GPU count 100000", id="text-many-gpus"),
    _case(["plan", f"{M} on h100 num_gpus=-3"], 2, "GPU count -3", id="text-negative-num-gpus"),
    _case(["plan", f"{M} on 3090 rank -8"], 2, "LoRA rank -8", id="text-negative-rank"),
    _case(["plan", f"{M} on 3090 rank 0.5"], 2, ["LoRA rank 0.5", "whole number"], id="text-fraction-rank"),
    _case(["plan", f"{M} on 3090 rank 1000000"], 2, ["LoRA rank 1000000", "4096"], id="text-huge-rank"),
    _case(["plan", f"{M} on 3090 bs 1.5"], 2, "micro batch size 1.5", id="text-fraction-batch"),
    _case(["plan", f"{M} on 3090 bs 99999999999999999999"], 2, "micro batch size", id="text-20-digit-batch"),
    _case(["plan", f"{M} on 3090 bs=-4"], 2, "micro batch size -4", id="text-assigned-negative"),
    _case(["plan", f"{M} on 3090 -3 epochs"], 2, "epochs -3", id="text-negative-epochs"),
    _case(["plan", f"{M} on 3090 0 epochs"], 2, "epochs 0", id="text-zero-epochs"),
    _case(["plan", f"{M} on 3090 epochs 1e999"], 2, "epochs", id="text-infinite-epochs"),
    _case(["plan", f"{M} on 3090 dropout 1.5"], 2, "LoRA dropout 1.5", id="text-dropout"),
    _case(["plan", f"{M} on 3090 dropout -0.1"], 2, "LoRA dropout -0.1", id="text-negative-dropout"),
    _case(["plan", f"{M} on 3090 effective batch -16"], 2, "effective batch size -16", id="text-negative-ebs"),
    _case(["plan", f"{M} on 3090 bs 4 grad accum 0"], 2, "gradient accumulation steps 0", id="text-zero-accum"),
    _case(["plan", f"{M} on 3090 transformers 99"], 2, ["'99'", "4.x or 5.x"], id="text-transformers-99"),
    _case(["plan", ""], 2, "no model named", id="text-empty"),
    _case(["plan", "   \t "], 2, "no model named", id="text-blank"),
    _case(["plan", "x" * 5000], 2, "characters long", id="text-too-long"),
    _case(["plan", "\x00\x01\x02 \ud800 qwen"], 2, id="text-control-chars"),
    _case(["plan", f"{M} on 3090 🚀🚀"], 0, id="text-emoji-ok"),
    _case(["plan", f"{M} on 3090 with /no/such/file.jsonl"], 2, "file.jsonl", id="text-missing-data"),
    _case(["plan", f"{M} on 3090 with {{binary_jsonl}}"], 2, id="text-binary-data"),
    _case(["plan", f"{M} on 3090 with {{empty_jsonl}}"], 2, id="text-empty-data"),
    _case(["plan", "lora {noconfig} on 3090"], 2, "config.json", id="text-folder-without-config"),
    # ---- plan: flags --------------------------------------------------------------------------------------
    _case(["plan", f"{M} on 3090", "--rank", "1000000"], 2, ["--rank", "1000000", "4096"], id="flag-huge-rank"),
    _case(["plan", f"{M} on 3090", "--rank", "0"], 2, "--rank", id="flag-zero-rank"),
    _case(["plan", f"{M} on 3090", "--rank", "-1"], 2, "--rank", id="flag-negative-rank"),
    _case(["plan", f"{M} on 3090", "--rank", "abc"], 2, "--rank", id="flag-text-rank"),
    _case(["plan", f"{M} on 3090", "--transformers", "99"], 2, ["'99'", "4.x or 5.x"], id="flag-transformers-99"),
    _case(["plan", f"{M} on 3090", "--transformers", "3.0"], 2, "4.x or 5.x", id="flag-transformers-3"),
    _case(["plan", f"{M} on 3090", "--transformers", "latest"], 2, "4.x or 5.x", id="flag-transformers-word"),
    _case(["plan", f"{M} on 3090", "--gpus", "100000"], 2, ["--gpus", "100000"], id="flag-many-gpus"),
    _case(["plan", f"{M} on 3090", "--gpus", "0"], 2, "--gpus", id="flag-zero-gpus"),
    _case(["plan", f"{M} on 3090", "--batch", "100000000"], 2, ["--batch", "100000000"], id="flag-huge-batch"),
    _case(["plan", f"{M} on 3090", "--seq", "1000000000"], 2, "--seq", id="flag-huge-seq"),
    _case(["plan", f"{M} on 3090", "--epochs", "0"], 2, "--epochs", id="flag-zero-epochs"),
    _case(["plan", f"{M} on 3090", "--epochs", "nan"], 2, "--epochs", id="flag-nan-epochs"),
    _case(["plan", f"{M} on 3090", "--epochs", "inf"], 2, "--epochs", id="flag-inf-epochs"),
    _case(["plan", f"{M} on 3090", "--effective-batch", "0"], 2, "--effective-batch", id="flag-zero-ebs"),
    _case(["plan", f"{M} on 3090", "--lora-dropout", "1.0"], 2, "--lora-dropout", id="flag-dropout"),
    _case(["plan", f"{M} on 3090", "--optimizer", "adamx"], 2, "adamx", id="flag-optimizer"),
    _case(["plan", f"{M} on 3090", "--method", "qlor"], 2, "qlor", id="flag-method"),
    _case(["plan", f"{M} on 3090", "--trainer", "keras"], 2, "keras", id="flag-trainer"),
    _case(["plan", f"{M} on 3090", "--checkpoint-mode", "sometimes"], 2, "sometimes", id="flag-ckpt-mode"),
    _case(["plan", f"{M} on 3090", "--emit", "deepspeed"], 2, "deepspeed", id="flag-emit"),
    _case(["plan", f"{M} on 3090", "--targets", ","], 2, "--targets", id="flag-empty-targets"),
    _case(["plan", f"{M} on 3090", "--json", "--markdown"], 2, "--json", id="flag-two-formats"),
    _case(["plan", f"{M} on 3090", "--no-such-flag"], 2, "--no-such-flag", id="flag-unknown"),
    _case(["plan", "--model", "{binary_json}", "--gpu", "3090"], 2, id="flag-binary-model"),
    _case(["plan", "--model", "{noconfig}", "--gpu", "3090"], 2, ["no config.json", "noconfig"], id="flag-folder-without-config"),
    _case(["plan", "--model", "{emptydir}", "--gpu", "3090"], 2, "no config.json", id="flag-empty-folder"),
    _case(["plan", "--model", "{nofolder_config_json}", "--gpu", "3090"], 2, "config.json", id="flag-binary-config"),
    _case(["plan", "--model", "{badjson_config_json}", "--gpu", "3090"], 2, "config.json", id="flag-broken-config"),
    _case(["plan", "--model", "{listjson_config_json}", "--gpu", "3090"], 2, "config.json", id="flag-list-config"),
    _case(["plan", "--model", "{unknownarch_config_json}", "--gpu", "3090"], 2, "not-a-model", id="flag-unknown-arch"),
    _case(["plan", "--model", "{negative_config_json}", "--gpu", "3090"], 2, "hidden_size", id="flag-negative-config"),
    _case(["plan", "--model", "{hugelayers_config_json}", "--gpu", "3090"], 2, ["num_hidden_layers", "10,000"],
          id="flag-billion-layers"),  # planned in 0.1 s, not a hang over per-layer lists
    _case(["plan", "--model", "{nopositions_config_json}", "--gpu", "3090"], 2, "max_position_embeddings",
          id="flag-zero-positions"),
    _case(["plan", "--model", "{textsize_config_json}", "--gpu", "3090"], 2, ["hidden_size", "'64'"], id="flag-text-size"),
    _case(["plan", "--model", "{kvheads_config_json}", "--gpu", "3090"], 2, ["num_key_value_heads 8", "4"],
          id="config-more-kv-heads-than-heads"),
    _case(["plan", "--model", "{kvheads3_config_json}", "--gpu", "3090"], 2, ["num_key_value_heads 3", "divide"],
          id="config-kv-heads-not-a-divisor"),
    _case(["plan", "--model", "/tmp/" + "a" * 5000 + "/config.json", "--gpu", "3090"], 2, "File name too long",
          id="flag-name-too-long"),
    _case(["plan", "--model", "qwen2.5-0.5b", "--gpu", ""], 2, id="flag-empty-gpu"),
    _case(["plan", "--model", "qwen2.5-0.5b", "--gpu", "3090", "--dataset", "{binary_jsonl}"], 2, id="flag-binary-data"),
    # ---- compare / models / gpus / benchmark --------------------------------------------------------------
    _case(["compare", M, "--seq", "0"], 2, "--seq", id="compare-zero-seq"),
    _case(["compare", M, "--seq", "1000000000"], 2, "--seq", id="compare-huge-seq"),
    _case(["compare", f"{M} seq -5"], 2, "sequence length -5", id="compare-negative-seq"),
    _case(["compare", ""], 2, id="compare-empty"),
    _case(["models", "zzzz-no-such-model"], 1, "no bundled model", id="models-unknown"),
    _case(["models", "--size", "-1"], 1, "no bundled model", id="models-negative-size"),
    _case(["models", "--size", "\x00"], 1, "no bundled model", id="models-nul-size"),
    _case(["models", "--architectures", "zzzz"], 1, "no architecture", id="models-arch-unknown"),
    _case(["gpus", "--json", "--markdown"], 2, "--json", id="gpus-two-formats"),
    _case(["gpus", "extra"], 2, id="gpus-extra-arg"),
    _case(["benchmark", "qwen2.5-0.5b", "--batch", "0"], 2, "--batch", id="benchmark-zero-batch"),
    _case(["benchmark", "qwen2.5-0.5b", "--seq", "1"], 2, "--seq", id="benchmark-seq-1"),
    _case(["benchmark", "qwen2.5-0.5b", "--steps", "-3"], 2, "--steps", id="benchmark-negative-steps"),
    _case(["benchmark", "qwen2.5-0.5b", "--gpu", "nope"], 2, "unknown GPU 'nope'", id="benchmark-unknown-gpu"),
    _case(["benchmark", "qwen2.5-0.5b", "--method", "foo"], 2, ["method", "'foo'"], id="benchmark-unknown-method"),
    _case(["benchmark", "nope-model"], 2, "unknown model", id="benchmark-unknown-model"),
    # ---- run / resume / status / interrupt / command / export ---------------------------------------------
    _case(["run"], 2, "--config", id="run-nothing"),
    _case(["run", "--config", "/no/such/run.yaml"], 2, "run.yaml", id="run-missing-config"),
    _case(["run", "--config", "{binary_yaml}"], 2, id="run-binary-config"),
    _case(["run", "--config", "{broken_yaml}"], 2, id="run-broken-config"),
    _case(["run", "--config", "{list_yaml}"], 2, id="run-list-config"),
    _case(["run", "--config", "{run_unknown_yaml}"], 2, "no_such_key", id="run-unknown-key"),
    _case(["run", "--config", "{run_inf_sigma_yaml}"], 2, ["monitoring.spike_sigma inf", "finite"], id="run-inf-sigma"),
    _case(["run", "--config", "{run_nan_boost_yaml}"], 2, ["curriculum.boost nan", "finite"], id="run-nan-boost"),
    _case(["run", "--config", "{root}"], 2, id="run-folder-config"),
    _case(["run", "--plan", "/no/such/plan.json"], 2, "plan.json", id="run-missing-plan"),
    _case(["run", "--plan", "{binary_json}"], 2, id="run-binary-plan"),
    _case(["run", "--plan", "{broken_json}"], 2, id="run-broken-plan"),
    _case(["run", "--plan", "{array_json}"], 2, id="run-array-plan"),
    _case(["run", "--plan", "{plan_bad_json}"], 2, id="run-invalid-plan"),
    _case(["run", "--demo", "--wait", "abc"], 2, "--wait", id="run-text-wait"),
    _case(["run", "--demo", "--wait", "-5"], 2, "--wait", id="run-negative-wait"),
    _case(["resume", "--run-id", "nope", "--wait", "nan", "--runs-dir", "{root}"], 2, "--wait", id="resume-nan-wait"),
    _case(["resume", "--run-id", "nope", "--runs-dir", "{root}"], 2, "nope", id="resume-unknown"),
    _case(["resume", "--run-id", "../../etc", "--runs-dir", "{root}"], 2, id="resume-traversal"),
    _case(["resume", "--run-id", "", "--runs-dir", "{root}"], 2, id="resume-empty-id"),
    _case(["status", "--run-id", "nope", "--runs-dir", "{root}"], 2, "nope", id="status-unknown"),
    _case(["status", "--run-id", "../noconfig", "--runs-dir", "{root}"], 2, id="status-traversal"),
    _case(["status", "--run-id", "x", "--runs-dir", "/dev/null"], 2, id="status-runs-dir-file"),
    _case(["status", "--run-id", "x", "--runs-dir", "{binary_yaml}"], 2, id="status-runs-dir-binary"),
    _case(["status"], 2, "--run-id", id="status-no-id"),
    _case(["interrupt", "--run-id", "nope", "--runs-dir", "{root}"], 2, "nope", id="interrupt-unknown"),
    _case(["command", "nope", "set_lr 1e-5", "--runs-dir", "{root}"], 2, "nope", id="command-unknown-run"),
    _case(["command", "nope", "", "--runs-dir", "{root}"], 2, id="command-empty"),
    _case(["command", "nope", "set_lr -1", "--runs-dir", "{root}"], 2, id="command-negative-lr"),
    _case(["export", "nope", "--runs-dir", "{root}"], 2, "nope", id="export-unknown"),
    _case(["export", "nope", "/dev/null/x", "--runs-dir", "{root}"], 2, id="export-under-a-file"),
    _case(["status", "--run-id", "binconfig", "--runs-dir", "{runs}"], 2, ["damaged config.json", "UTF-8"],
          id="status-binary-run-config"),
    _case(["resume", "--run-id", "emptyconfig", "--runs-dir", "{runs}"], 2, ["damaged config.json", "not JSON"],
          id="resume-empty-run-config"),
    _case(["command", "binevents", "status", "--runs-dir", "{runs}"], 2, "damaged events.jsonl",
          id="command-binary-events"),
    _case(["export", "baddb", "--runs-dir", "{runs}"], 2, "damaged supervisor.sqlite", id="export-bad-database"),
    _case(["status", "--run-id", "baddb", "--runs-dir", "{runs}"], 2, "not a SQLite database", id="status-bad-database"),
    _case(["export", "nope", "--step", "-1", "--runs-dir", "{root}"], 2, id="export-negative-step"),
    _case(["export", "nope", "--step", "abc", "--runs-dir", "{root}"], 2, "--step", id="export-text-step"),
    # ---- merge / evomerge / compress ----------------------------------------------------------------------
    _case(["merge", "/no/such/merge.yml", "{root}/out1"], 2, "merge.yml", id="merge-missing"),
    _case(["merge", "{binary_yaml}", "{root}/out2"], 2, "binary.yaml", id="merge-binary"),
    _case(["merge", "{empty_yaml}", "{root}/out3"], 2, id="merge-empty"),
    _case(["merge", "{list_yaml}", "{root}/out3"], 2, id="merge-list"),
    _case(["merge", "{broken_yaml}", "{root}/out3"], 2, "YAML", id="merge-broken"),
    _case(["merge", "{root}", "{root}/out3"], 2, id="merge-folder-config"),
    _case(["merge", "{slerp_t_yml}", "{root}/out4"], 2, ["t", "7.5", "from 0 to 1"], id="merge-slerp-t"),
    _case(["merge", "{slerp_t_neg_yml}", "{root}/out4"], 2, ["-0.1", "from 0 to 1"], id="merge-slerp-t-negative"),
    _case(["merge", "{slerp_t_grad_yml}", "{root}/out4"], 2, ["3", "from 0 to 1"], id="merge-slerp-t-gradient"),
    _case(["merge", "{slerp_t_nan_yml}", "{root}/out4"], 2, "nan", id="merge-slerp-t-nan"),
    _case(["merge", "{slerp_t_str_yml}", "{root}/out4"], 2, "abc", id="merge-slerp-t-text"),
    _case(["merge", "{ties_density_yml}", "{root}/out4"], 2, ["density", "0"], id="merge-density-zero"),
    _case(["merge", "{ties_density_big_yml}", "{root}/out4"], 2, ["density", "1.5"], id="merge-density-big"),
    _case(["merge", "{linear_weight_inf_yml}", "{root}/out4"], 2, ["weight", "inf"], id="merge-weight-inf"),
    _case(["merge", "{ties_lambda_nan_yml}", "{root}/out4"], 2, ["lambda", "nan"], id="merge-lambda-nan"),
    _case(["merge", "{layer_range_yml}", "{root}/out4"], 2, "layer_range", id="merge-layer-range"),
    _case(["merge", "{slerp_t_yml}", "{root}/out5", "--max-shard-size", "abc"], 2, "abc", id="merge-shard-size"),
    _case(["merge", "{slerp_t_yml}", "{root}/out5", "--max-shard-size", "-5GB"], 2, "-5GB", id="merge-negative-shard"),
    _case(["merge", "{slerp_t_yml}", "{root}/out5", "--max-shard-size", "0"], 2, id="merge-zero-shard"),
    _case(["merge", "/dev/zero", "{root}/out6"], 2, "not a regular file", id="merge-dev-zero"),  # not read: endless
    _case(["evomerge", "/dev/zero", "{root}/evo2"], 2, "not a regular file", id="evomerge-dev-zero"),
    _case(["evomerge", "{root}", "{root}/evo2"], 2, "is a folder", id="evomerge-folder-config"),
    _case(["evomerge", "/no/such/evo.yml", "{root}/evo1"], 2, "evo.yml", id="evomerge-missing"),
    _case(["evomerge", "{binary_yaml}", "{root}/evo1"], 2, "binary.yaml", id="evomerge-binary"),
    _case(["evomerge", "{evo_pop_yml}", "{root}/evo1"], 2, ["population", "3"], id="evomerge-population"),
    _case(["evomerge", "{evo_rate_yml}", "{root}/evo1"], 2, ["mutation_rate", "-1"], id="evomerge-rate"),
    _case(["evomerge", "{evo_gens_yml}", "{root}/evo1"], 2, "generations", id="evomerge-generations"),
    _case(["compress", "/no/such/model", "{root}/c1"], 2, id="compress-missing"),
    _case(["compress", "{noconfig}", "{root}/c1"], 2, "config.json", id="compress-folder-without-config"),
    _case(["compress", "{binary_yaml}", "{root}/c1"], 2, id="compress-file"),
    _case(["compress", "{noconfig}", "{root}/c1", "--seq-len", "0"], 2, "--seq-len", id="compress-zero-seq"),
    _case(["compress", "{noconfig}", "{root}/c1", "--lr", "nan"], 2, "--lr", id="compress-nan-lr"),
    _case(["compress", "{noconfig}", "{root}/c1", "--lr", "0"], 2, "--lr", id="compress-zero-lr"),
    _case(["compress", "{noconfig}", "{root}/c1", "--keep-layer", "-1"], 2, "--keep-layer", id="compress-negative-layer"),
    _case(["compress", "{noconfig}", "{root}/c1", "--batch-size", "0"], 2, "--batch-size", id="compress-zero-batch"),
    _case(["compress", "{noconfig}", "{root}/c1", "--max-drop", "2"], 2, "--max-drop", id="compress-max-drop"),
    _case(["merge", "{slerp_t_yml}", "{root}/out7", "--seed", "-1"], 2, "--seed", id="merge-negative-seed"),
    _case(["compress", "{noconfig}", "{root}/c1", "--scale-dtype", "int4"], 2, id="compress-scale-dtype"),
    _case(["no-such-command"], 2, "no-such-command", id="unknown-command"),
]


@pytest.mark.parametrize(("argv", "code", "says", "one_line"), CASES)
def test_bad_input_is_one_line_never_a_traceback(argv, code, says, one_line, files, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("AEGIS_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("AEGIS_RUNS_DIR", files["root"])
    monkeypatch.chdir(tmp_path)
    args = [a.format(**files) if "{" in a else a for a in argv]
    with pytest.raises(SystemExit) as info:
        main(args)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert info.value.code == code, err
    if code:
        lines = [line for line in err.splitlines() if line.strip()][-1 if not one_line else 0:]
        assert len(lines) == 1, err
        assert lines[0].startswith("error:") or code == 1, err
        for fragment in says:
            assert fragment in lines[0], lines[0]
        assert not (tmp_path / "logs").exists(), f"an expected error was logged as a crash: {err}"


def test_a_validation_error_is_one_line_naming_the_field_the_value_and_the_range():
    from pydantic import BaseModel, ConfigDict, Field, ValidationError

    from aegis._validation import check_range, validation_line

    class Inner(BaseModel):
        model_config = ConfigDict(extra="forbid")
        rank: int = Field(default=8, ge=1, le=4096)
        dropout: float = Field(default=0.0, ge=0, lt=1)

    class Outer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: str
        inner: list[Inner] = []

    def line(data, model=Outer):
        with pytest.raises(ValidationError) as info:
            model.model_validate(data)
        return validation_line(info.value, where="x.yaml: ", model=model)

    assert line({"nme": "a"}) == "x.yaml: unknown key 'nme'; did you mean 'name'?"  # the typo, not 'name' missing
    assert line({"name": "a", "rank": 1}) == "x.yaml: unknown key 'rank'; valid keys: name, inner"
    assert line({}) == "x.yaml: missing key 'name'"
    assert line({"rank": 10**6}, Inner) == "x.yaml: rank 1000000 is out of range: accepted from 1 to 4096"
    assert line({"dropout": 1.0}, Inner) == "x.yaml: dropout 1.0 is out of range: accepted in [0, 1)"
    assert line({"name": "a", "inner": [{"rank": "many"}]}).startswith("x.yaml: inner[0].rank: Input should be a valid")
    assert "(got 'many')" in line({"name": "a", "inner": [{"rank": "many"}]})
    assert check_range("t", 7.5, 0, 1) == "t 7.5 is out of range: accepted from 0 to 1"
    assert check_range("t", float("nan"), 0, 1) == "t nan is not a finite number: give a number from 0 to 1"
    assert check_range("n", 2.5, 1, 8, integer=True) == "n 2.5 is not a whole number: give one from 1 to 8"
    assert check_range("density", 0, 0, 1, low_open=True) == "density 0 is out of range: accepted in (0, 1]"
    assert check_range("w", True) is not None and check_range("w", -3.0) is None
