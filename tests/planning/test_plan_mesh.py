"""A multi-GPU plan carries the JAX engine's mesh, and `aegis run --plan`'s translation uses it.

The mesh follows the plan's own DDP/FSDP choice (`planner._multi_gpu`): a model that does not fit one GPU is
sharded over all of them (``{fsdp: N}``), one that fits runs as data ranks (``{data: N}``); a one-GPU plan has no
mesh. The run config the plan becomes (`supervise.config.run_config_from_report`) holds the same mesh, and the
device count of that mesh is the plan's GPU count.
"""

from __future__ import annotations

import aegis
from aegis.data import toy_dataset_path
from aegis.supervise.run_config import run_config_from_report


def test_a_model_too_big_for_one_gpu_is_planned_and_run_fully_sharded() -> None:
    report = aegis.plan(model="llama-3.1-8b", method="full", gpu="a100-80gb", gpu_count=4, dataset=str(toy_dataset_path()),
                        detect_stack=False)
    assert report.multi_gpu is not None and report.multi_gpu.assumed == "fsdp"
    assert report.multi_gpu.parallel == {"fsdp": 4}
    assert '"parallel":{"fsdp":4}' in report.model_dump_json()  # the plan's JSON carries it
    run = run_config_from_report(report)
    assert run.parallel is not None and (run.parallel.data, run.parallel.fsdp, run.parallel.tensor) == (1, 4, 1)
    assert run.parallel.devices == report.gpu_count


def test_a_model_that_fits_one_gpu_runs_as_data_ranks_and_one_gpu_has_no_mesh() -> None:
    report = aegis.plan(model="llama-3.1-8b", method="lora", gpu="h100-80gb", gpu_count=2, dataset=str(toy_dataset_path()),
                        detect_stack=False)
    assert report.multi_gpu is not None and report.multi_gpu.assumed == "ddp"
    assert run_config_from_report(report).parallel.data == 2
    single = aegis.plan(model="llama-3.1-8b", method="qlora", gpu="3090", dataset=str(toy_dataset_path()), detect_stack=False)
    assert single.multi_gpu is None and run_config_from_report(single).parallel is None
