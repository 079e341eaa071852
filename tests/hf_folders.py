"""The tiny Hugging Face model folders and datasets the tests build: they live in :mod:`tools.hf_folders` (one home,
shared with `tools/bench`); this module keeps ``from tests.hf_folders import make_model_folder`` working."""

from tools.hf_folders import (
    CHATML,
    CHATML_GENERATION,
    LLAMA_LIKE,
    SPECIALS,
    corpus,
    make_model_folder,
    make_tokenizer,
    write_alpaca,
    write_messages,
    write_sharegpt,
)

__all__ = [
    "CHATML", "CHATML_GENERATION", "LLAMA_LIKE", "SPECIALS", "corpus", "make_model_folder", "make_tokenizer",
    "write_alpaca", "write_messages", "write_sharegpt",
]
