"""aegis.train.compile_cache: where runs keep compiled programs, and that a second process reads them back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROGRAM = """
import json, jax, jax.numpy as jnp
from aegis.train import compile_cache
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None)
folder = compile_cache.enable()
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
c = f.lower(jnp.ones((64, 64))).compile()
print(json.dumps({"folder": str(folder), "min_s": jax.config.jax_persistent_cache_min_compile_time_secs,
                  "temp": c.memory_analysis().temp_size_in_bytes, "hits": len(hits)}))
"""


def _run(env: dict[str, str]) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT") and k != "JAX_COMPILATION_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", PROGRAM], env={**base, **env}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_runs_cache_under_xdg_and_a_second_process_reads_the_same_program(tmp_path: Path):
    first = _run({"XDG_CACHE_HOME": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
    folder = tmp_path / "aegis" / "jax"
    assert first["folder"] == str(folder) and first["min_s"] == 0.0  # the environment's threshold is kept
    assert first["hits"] == 0
    written = {p.name for p in folder.iterdir() if p.name.endswith("-cache")}
    assert any(name.startswith("jit__lambda") for name in written), written
    second = _run({"XDG_CACHE_HOME": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
    assert second["hits"] >= 1 and second["temp"] == first["temp"]  # read back, memory analysis included
    assert {p.name for p in folder.iterdir() if p.name.endswith("-cache")} == written


def test_a_folder_the_environment_names_wins_and_the_default_threshold_applies(tmp_path: Path):
    got = _run({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine")})
    assert got["folder"] == str(tmp_path / "mine") and got["min_s"] == 0.5
    assert not (tmp_path / "xdg").exists()
