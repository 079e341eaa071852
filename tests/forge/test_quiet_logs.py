"""The narrow filter on transformers' "model of type `cognate`" warning: gone inside the block (and in a function it
decorates), still emitted outside it, and other model types' warnings pass."""

from __future__ import annotations

import json
import logging

import pytest


def _folder(tmp_path, model_type):
    from tools.hf_folders import make_tokenizer

    folder = tmp_path / model_type
    make_tokenizer(None).save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _warnings(records, folder, wrap=None):
    from transformers import AutoTokenizer

    records.messages.clear()
    load = lambda: AutoTokenizer.from_pretrained(folder, trust_remote_code=False)  # noqa: E731
    (wrap(load) if wrap else load)()
    return [m for m in records.messages if "model of type" in m]


@pytest.mark.filterwarnings("ignore")
def test_cognate_type_warning_is_dropped_only_inside_the_block(tmp_path):
    from aegis.forge._quiet_logs import quiet_cognate_config_warning

    cognate, other = _folder(tmp_path, "cognate"), _folder(tmp_path, "not-a-registered-type")
    records, logger = _Records(), logging.getLogger("transformers")
    logger.addHandler(records)
    try:
        assert any("`cognate`" in m for m in _warnings(records, cognate))  # transformers emits it
        with quiet_cognate_config_warning():
            assert _warnings(records, cognate) == []
            assert _warnings(records, _folder(tmp_path, "aegis-bitnet-b1.58")) == []  # a packed ternary folder
            assert _warnings(records, other)  # another type's warning still passes
        assert _warnings(records, cognate, quiet_cognate_config_warning()) == []  # as a decorator
        assert _warnings(records, cognate)  # the filter is gone after the block
    finally:
        logger.removeHandler(records)
