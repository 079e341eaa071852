"""Test-wide settings: hermetic (no Hub, no analytics), CPU only."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# one OpenMP thread for torch and BLAS (read when they load): the references are tiny models, where a second
# thread only spins, and under `-n 2` on 2 cores it spins on the core the other worker needs (the same
# transformers eval: 0.9 s on 1 thread, 17.7 s on 2 on a loaded machine)
os.environ.setdefault("OMP_NUM_THREADS", "1")
