"""Test-wide settings: hermetic (no Hub, no analytics), CPU only."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent XLA compilation cache (`aegis.train.compile_cache`) for the whole suite, its xdist workers and the
# runs its tests start as subprocesses: tests build fresh trainers whose programs an earlier test compiled, and a
# tiny model still takes seconds to compile on 2 cores. A hit is XLA's own executable, memory analysis included.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "aegis-jax-compile"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# one OpenMP thread for torch and BLAS (read when they load): the references are tiny models, where a second
# thread only spins, and under `-n 2` on 2 cores it spins on the core the other worker needs (the same
# transformers eval: 0.9 s on 1 thread, 17.7 s on 2 on a loaded machine)
os.environ.setdefault("OMP_NUM_THREADS", "1")

