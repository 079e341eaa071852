"""XLA's persistent compilation cache for runs: a resumed or restarted run reuses the programs an earlier process
compiled, so it starts in seconds instead of compiling again.

The folder is ``$JAX_COMPILATION_CACHE_DIR`` when set (JAX reads it itself), else ``$XDG_CACHE_HOME/aegis/jax``
(``~/.cache/aegis/jax``). Programs that compiled in under half a second are not written (JAX's
``jax_persistent_cache_min_compile_time_secs``, unless ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` says
otherwise). A cache hit returns the executable XLA compiled, with its memory and cost analysis.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MIN_COMPILE_TIME_S", "default_dir", "enable"]

MIN_COMPILE_TIME_S = 0.5
"""Programs that compile faster than this are not worth a file."""


def default_dir() -> Path:
    """Where runs keep compiled programs when the environment names no folder."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aegis" / "jax"


def enable() -> Path:
    """Turn the cache on for this process (a folder the caller or the environment set is kept); returns the folder."""
    import jax

    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(default_dir()))
    if not os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    return Path(jax.config.jax_compilation_cache_dir)
