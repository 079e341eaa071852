"""Calibration store: measured throughput and peak memory, keyed by (GPU id, model id, method).

``aegis benchmark`` writes a :class:`CalibrationRecord` after running real steps; the planner
looks one up and, when found, reports "measured" instead of "estimated". The store is one
JSON file, ``$AEGIS_HOME/calibration.json`` (default ``~/.cache/aegis``), written atomically
(temp file + rename) so a crash never leaves it half written. Importing this module is cheap:
no JAX.

    store = CalibrationStore()
    store.record(CalibrationRecord(gpu_id="h100-80gb", model_id="meta-llama/Llama-3.2-1B", method="lora",
                                   tokens_per_s=41000.0, peak_memory_bytes=9_800_000_000, device="NVIDIA H100",
                                   micro_batch_size=8, seq_len=2048, measured_at="2026-11-22T06:00:00+00:00"))
    rec = store.lookup("h100-80gb", "meta-llama/Llama-3.2-1B", "lora")   # None when never measured
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from pydantic import Field, ValidationError

from aegis.errors import InvalidConfigError
from aegis.schema import Framework, Frozen, Method, Precision

__all__ = ["CalibrationRecord", "CalibrationStore", "aegis_home", "default_store_path", "utc_now"]

_FILE_VERSION = 1


def aegis_home() -> Path:
    """``$AEGIS_HOME`` or ``~/.cache/aegis``."""
    return Path(os.environ.get("AEGIS_HOME") or Path.home() / ".cache" / "aegis")


def default_store_path() -> Path:
    return aegis_home() / "calibration.json"


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string (what ``measured_at`` holds)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class CalibrationRecord(Frozen):
    """One measurement of a training configuration on one device."""

    gpu_id: str = Field(description="Catalog GPU id (or 'cpu'): the device class the numbers hold for.")
    model_id: str = Field(description="Model id as the planner resolves it.")
    method: Method = Field(description="full, lora or qlora.")
    tokens_per_s: float = Field(gt=0, description="Measured training throughput, positions per second per device.")
    peak_memory_bytes: int = Field(ge=0, description="Measured peak device memory of the step.")
    memory_source: str = Field(
        default="device", description="'device' (allocator peak) or 'compiled' (XLA memory analysis)."
    )
    device: str = Field(description="Device as the runtime names it, e.g. 'NVIDIA H100 80GB HBM3'.")
    micro_batch_size: int = Field(ge=1, description="Sequences per device per micro step.")
    seq_len: int = Field(ge=1, description="Tokens per sequence.")
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    gradient_checkpointing: bool = False
    remat_layers: int | None = Field(
        default=None, description="With gradient checkpointing: the layers the engine recomputed (None: every layer).")
    precision: Precision = "bf16"
    framework: Framework = "jax"
    steps: int = Field(default=10, ge=1, description="Timed steps the throughput averages.")
    step_time_s: float = Field(default=0.0, ge=0, description="Mean wall time of one timed step.")
    mfu: float | None = Field(default=None, description="Model FLOPs utilisation, when the peak FLOPs are known.")
    measured_at: str = Field(default_factory=utc_now, description="ISO-8601 UTC time of the measurement.")

    @property
    def key(self) -> str:
        return CalibrationStore.key(self.gpu_id, self.model_id, self.method)


class CalibrationStore:
    """Read/write access to the calibration JSON file (latest record per key wins)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_store_path()

    @staticmethod
    def key(gpu_id: str, model_id: str, method: str) -> str:
        return f"{gpu_id}|{model_id}|{method}"

    def _read(self) -> dict[str, CalibrationRecord]:
        if not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return {k: CalibrationRecord.model_validate(v) for k, v in raw.get("records", {}).items()}
        except (json.JSONDecodeError, ValidationError, AttributeError) as err:
            raise InvalidConfigError(
                f"calibration store {self.path} is unreadable ({err.__class__.__name__}); "
                "delete it and run `aegis benchmark` again"
            ) from err

    def records(self) -> list[CalibrationRecord]:
        """Every stored record."""
        return list(self._read().values())

    def lookup(self, gpu_id: str, model_id: str, method: str) -> CalibrationRecord | None:
        """The latest measurement for this GPU, model and method, or None."""
        return self._read().get(self.key(gpu_id, model_id, method))

    def record(self, rec: CalibrationRecord) -> Path:
        """Store ``rec`` (replacing an older one with the same key); returns the file path."""
        records = self._read()
        records[rec.key] = rec
        payload = {
            "version": _FILE_VERSION,
            "records": {k: r.model_dump(mode="json") for k, r in sorted(records.items())},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".json", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(payload, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.path
