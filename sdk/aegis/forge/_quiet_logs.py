"""One narrow logging filter: transformers' "model of type `cognate`" warning (and `aegis-bitnet-b1.58`'s), where Aegis
reads its own Cognate and packed-ternary folders.

A Cognate folder's ``config.json`` names ``model_type: cognate`` and an ``auto_map`` to its own modeling code. Aegis
loads such folders' tokenizers without remote code on purpose (no prompt), and transformers then warns "You are
using a model of type `cognate` to instantiate a model of type ``" on every load (EvoMerge: several times a
candidate). A packed ternary folder (``model_type: aegis-bitnet-b1.58``, `aegis.forge.bitnet.FORMAT`) draws the same
warning when `aegis generate` reads its tokenizer. :func:`quiet_cognate_config_warning` drops those messages while
Aegis loads its own folders; every other record (other model types, other warnings) still passes.

    with quiet_cognate_config_warning():
        tok = AutoTokenizer.from_pretrained(cognate_folder, trust_remote_code=False)
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

__all__ = ["quiet_cognate_config_warning"]

_LOGGER = "transformers.configuration_utils"  # the logger that emits it (logging.getLogger: no transformers import)
_MESSAGES = tuple(f"You are using a model of type `{kind}` to instantiate" for kind in ("cognate", "aegis-bitnet-b1.58"))


class _DropCognateTypeWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_MESSAGES)


@contextmanager
def quiet_cognate_config_warning() -> Iterator[None]:
    """Within the block, transformers' config loader drops its "model of type `cognate`" warning (also usable as a
    decorator)."""
    logger, f = logging.getLogger(_LOGGER), _DropCognateTypeWarning()
    logger.addFilter(f)
    try:
        yield
    finally:
        logger.removeFilter(f)
