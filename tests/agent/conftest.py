"""Agent test fixtures: a fast run template."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent._runs import write_template


@pytest.fixture
def fast_template(tmp_path: Path) -> Path:
    return write_template(tmp_path)
