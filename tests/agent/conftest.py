"""Agent test fixtures: a fast run template and the shared XLA compile cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent._runs import enable_compile_cache, write_template


@pytest.fixture(scope="session")
def jax_compile_cache(request: pytest.FixtureRequest) -> Path:
    return enable_compile_cache(request.config)


@pytest.fixture
def fast_template(tmp_path: Path) -> Path:
    return write_template(tmp_path)
