"""What `tools.import_catalog` puts in the model catalog, and from where: one row per config.json.

A row names the Hub ids the config serves (canonical first; more only where the source gives them the
same config), the release line (``family``), ``size`` and ``variant``, the source entry it is converted
from, every key set from elsewhere with the reason, and the parameter counts the authors (or the Hub)
publish. Vendored rows are real Hub files kept byte for byte; their metadata lives here too.

Sources (pinned):
  litgpt 0.5.13     ``litgpt/config.py`` ``configs`` (name → n_layer, n_embd, n_head, ...)
  torchtune 0.6.1   ``torchtune/models/{qwen2,qwen2_5}/_model_builders.py`` (builder → dims)
  github            a config.json another public repository keeps (a copy of the Hub file, or a library's table
                    of them), named by ``owner/repo@commit:path[#key]``; kept as written there, like a Hub file
"""

from __future__ import annotations

from typing import Any

HUB = "Hugging Face Hub model page (safetensors parameter count)"
HUB_EXACT = "Hugging Face Hub safetensors metadata (total; tied embeddings counted once)"
QWEN25 = "Qwen2.5 model card, 'Number of Parameters'"
QWEN25_CODER = "Qwen2.5-Coder model card, 'Number of Parameters'"
QWEN3 = "Qwen3 model card, 'Number of Parameters'"
QWEN3_ACTIVE = "Qwen3 model card, 'Number of Activated Parameters'"
GEMMA2 = "Gemma 2 technical report (arXiv 2408.00118), Table 2, non-embedding parameters"
GEMMA3 = "Gemma 3 technical report (arXiv 2503.19786), Table 1, non-embedding parameters (text model)"
MIXTRAL = "Mistral AI, 'Mixtral of experts' announcement (Dec 2023)"
GEMMA1 = "Gemma technical report (arXiv 2403.08295), Table 2, non-embedding parameters"
MIXTRAL22 = "Mistral AI, 'Cheaper, Better, Faster, Stronger' announcement of Mixtral 8x22B (Apr 2024)"

DISTILL = ("litgpt has no config for this id: it is litgpt's config of {base}, the base model the DeepSeek-R1 "
           "model card's distillation table names, with the keys that differ set")
TIED_BY_COUNT = "not in the source; tied input/output embeddings are the only choice that agrees with the published count"


def P(value: str, where: str = HUB, counts: str = "total", disagrees: str = "") -> dict[str, str]:
    figure = {"value": value, "counts": counts, "where": where}
    return {**figure, "disagrees": disagrees} if disagrees else figure


QWEN_32_5 = ("the card's 32.5B is below the weights' own count: the Hub's safetensors total for Qwen2.5-32B is "
             "32,763,876,352, which the vendored Qwen2.5-32B config reproduces exactly")


def row(ids: str | tuple[str, ...], family: str, size: str, variant: str, source: tuple[str, str], *published: dict,
        set: dict[str, tuple[Any, str]] | None = None, arch: str | None = None, note: str = "",
        sole_size: str = "") -> dict[str, Any]:
    """``sole_size``: where it is published that the line was released in this one size (its name alone then
    names this entry)."""
    ids = (ids,) if isinstance(ids, str) else ids
    return {"ids": ids, "family": family, "size": size, "variant": variant, "source": source,
            "published": list(published), "set": set or {}, "arch": arch, "note": note, "sole_size": sole_size}


def tied(why: str = TIED_BY_COUNT) -> dict[str, tuple[Any, str]]:
    return {"tie_word_embeddings": (True, why)}


LITGPT = "litgpt"
TORCHTUNE = "torchtune"
VENDORED = "vendored"
GITHUB = "github"

# ---------------------------------------------------------------- real Hub files (byte-identical, kept)
ROWS: list[dict[str, Any]] = [
    row(("meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"), "llama-3.1", "8b", "base",
        (VENDORED, "meta-llama--Llama-3.1-8B.json"), P("8,030,261,248", HUB_EXACT)),
    row(("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"), "llama-3.1", "70b", "base",
        (VENDORED, "meta-llama--Llama-3.1-70B.json"), P("70,553,706,496", HUB_EXACT)),
    row("meta-llama/Llama-3.2-1B", "llama-3.2", "1b", "base", (VENDORED, "meta-llama--Llama-3.2-1B.json"),
        P("1,235,814,400", HUB_EXACT)),
    row("meta-llama/Llama-3.2-3B", "llama-3.2", "3b", "base", (VENDORED, "meta-llama--Llama-3.2-3B.json"),
        P("3,212,749,824", HUB_EXACT)),
    row("Qwen/Qwen2.5-0.5B", "qwen2.5", "0.5b", "base", (VENDORED, "Qwen--Qwen2.5-0.5B.json"),
        P("494,032,768", HUB_EXACT), P("0.49B", QWEN25)),
    row("Qwen/Qwen2.5-1.5B", "qwen2.5", "1.5b", "base", (VENDORED, "Qwen--Qwen2.5-1.5B.json"),
        P("1,543,714,304", HUB_EXACT), P("1.54B", QWEN25)),
    row("Qwen/Qwen2.5-7B", "qwen2.5", "7b", "base", (VENDORED, "Qwen--Qwen2.5-7B.json"),
        P("7,615,616,512", HUB_EXACT), P("7.61B", QWEN25)),
    row("Qwen/Qwen2.5-14B", "qwen2.5", "14b", "base", (VENDORED, "Qwen--Qwen2.5-14B.json"),
        P("14,770,033,664", HUB_EXACT), P("14.7B", QWEN25)),
    row("Qwen/Qwen2.5-32B", "qwen2.5", "32b", "base", (VENDORED, "Qwen--Qwen2.5-32B.json"),
        P("32,763,876,352", HUB_EXACT), P("32.5B", QWEN25, disagrees=QWEN_32_5)),
    row("Qwen/Qwen2.5-72B", "qwen2.5", "72b", "base", (VENDORED, "Qwen--Qwen2.5-72B.json"),
        P("72,706,203,648", HUB_EXACT), P("72.7B", QWEN25)),
    row("Qwen/Qwen3-0.6B", "qwen3", "0.6b", "instruct", (VENDORED, "Qwen--Qwen3-0.6B.json"),
        P("596,049,920", HUB_EXACT), P("0.6B", QWEN3)),
    row("Qwen/Qwen3-8B", "qwen3", "8b", "instruct", (VENDORED, "Qwen--Qwen3-8B.json"),
        P("8,190,735,360", HUB_EXACT), P("8.2B", QWEN3)),
    row("mistralai/Mistral-7B-v0.3", "mistral", "7b", "base", (VENDORED, "mistralai--Mistral-7B-v0.3.json"),
        P("7,248,023,552", HUB_EXACT)),
    row("microsoft/Phi-3-mini-4k-instruct", "phi-3", "3.8b", "instruct",
        (VENDORED, "microsoft--Phi-3-mini-4k-instruct.json"), P("3,821,079,552", HUB_EXACT),
        note="Instruct checkpoint: Microsoft published no base Phi-3-mini."),
    row("google/gemma-2-2b", "gemma-2", "2b", "base", (VENDORED, "google--gemma-2-2b.json"),
        P("2,614,341,888", HUB_EXACT), P("2,024,517,888", GEMMA2, "non_embedding")),
    row("google/gemma-2-9b", "gemma-2", "9b", "base", (VENDORED, "google--gemma-2-9b.json"),
        P("9,241,705,984", HUB_EXACT), P("8,324,201,984", GEMMA2, "non_embedding")),
    row("google/gemma-3-1b-pt", "gemma-3", "1b", "base", (VENDORED, "google--gemma-3-1b-pt.json"),
        P("999,885,952", HUB_EXACT), P("698M", GEMMA3, "non_embedding")),
    row("google/gemma-3-4b-pt", "gemma-3", "4b", "base", (VENDORED, "google--gemma-3-4b-pt.json"),
        P("3,209M", GEMMA3, "non_embedding"),
        set={"architectures, model_type": (None, "the checkpoint is Gemma3ForConditionalGeneration: this is its "
                                                 "text_config with Gemma3TextConfig defaults written out")},
        note="Text model only: the text_config of the multimodal Gemma3ForConditionalGeneration checkpoint, "
             "written as a Gemma3ForCausalLM (model_type gemma3_text) config with the Gemma3TextConfig defaults "
             "the published file leaves implicit filled in; the SigLIP vision tower and projector are not counted."),
    row("mistralai/Mixtral-8x7B-v0.1", "mixtral", "8x7b", "base", (VENDORED, "mistralai--Mixtral-8x7B-v0.1.json"),
        P("46,702,792,704", HUB_EXACT), P("12.9B", MIXTRAL, "active")),
    row("Qwen/Qwen1.5-MoE-A2.7B", "qwen1.5-moe", "a2.7b", "base", (VENDORED, "Qwen--Qwen1.5-MoE-A2.7B.json"),
        P("14,315,784,192", HUB_EXACT), P("2.7B", "Qwen1.5-MoE-A2.7B model card ('2.7B activated')", "active")),
    row("Qwen/Qwen3-30B-A3B", "qwen3", "30b-a3b", "instruct", (VENDORED, "Qwen--Qwen3-30B-A3B.json"),
        P("30,532,122,624", HUB_EXACT), P("30.5B", QWEN3), P("3.3B", QWEN3_ACTIVE, "active")),
]

# ---------------------------------------------------------------- converted from library data
_MAX32K_BASE = (32768, "Qwen3 base model cards: context length 32,768 (litgpt gives the base the post-trained 40,960)")
_GEMMA_EPS = (1e-06, "litgpt leaves Gemma's norm_eps at its 1e-5 default; the vendored gemma-2/gemma-3 Hub configs have 1e-6")
_GEMMA1_EPS = (1e-06, "litgpt leaves Gemma's norm_eps at its 1e-5 default; transformers' GemmaConfig default is 1e-6")
_GEMMA1_CTX = (8192, "litgpt's block_size default is 4096; the Gemma technical report (Table 1) and GemmaConfig "
                     "give an 8192-token context")
_GEMMA3_VOCAB = (262208, "litgpt has 262144 (the 1B's); the vendored gemma-3-4b-pt Hub text config of this release has 262208")

ROWS += [
    # Llama 2 and Code Llama
    row(("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"), "llama-2", "7b", "base",
        (LITGPT, "Llama-2-7b-hf"), P("6.74B")),
    row(("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf"), "llama-2", "13b", "base",
        (LITGPT, "Llama-2-13b-hf"), P("13B")),
    row(("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"), "llama-2", "70b", "base",
        (LITGPT, "Llama-2-70b-hf"), P("69B")),
    row(("codellama/CodeLlama-7b-hf", "codellama/CodeLlama-7b-Instruct-hf"), "codellama", "7b", "base",
        (LITGPT, "CodeLlama-7b-hf"), P("6.74B")),
    row("codellama/CodeLlama-7b-Python-hf", "codellama", "7b", "python", (LITGPT, "CodeLlama-7b-Python-hf"), P("6.74B")),
    row(("codellama/CodeLlama-13b-hf", "codellama/CodeLlama-13b-Instruct-hf"), "codellama", "13b", "base",
        (LITGPT, "CodeLlama-13b-hf"), P("13B"),
        note="litgpt gives CodeLlama-13b-Instruct-hf block_size 2048 but every other key of the base; the Code Llama "
             "paper trains all sizes and variants on 16,384-token sequences, so both ids share this config."),
    row("codellama/CodeLlama-13b-Python-hf", "codellama", "13b", "python", (LITGPT, "CodeLlama-13b-Python-hf"), P("13B")),
    row(("codellama/CodeLlama-34b-hf", "codellama/CodeLlama-34b-Instruct-hf", "codellama/CodeLlama-34b-Python-hf"),
        "codellama", "34b", "base", (LITGPT, "CodeLlama-34b-hf"), P("33.7B")),
    row(("codellama/CodeLlama-70b-hf", "codellama/CodeLlama-70b-Python-hf"), "codellama", "70b", "base",
        (LITGPT, "CodeLlama-70b-hf"), P("69B")),
    row("codellama/CodeLlama-70b-Instruct-hf", "codellama", "70b", "instruct", (LITGPT, "CodeLlama-70b-Instruct-hf"),
        P("69B")),
    # Llama 3 / 3.1 / 3.2 / 3.3
    row(("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct"), "llama-3", "8b", "base",
        (LITGPT, "Llama-3-8B"), P("8.03B")),
    row(("meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct"), "llama-3", "70b", "base",
        (LITGPT, "Llama-3-70B"), P("70.6B")),
    row(("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct"), "llama-3.1", "8b", "instruct",
        (LITGPT, "Llama-3.1-8B-Instruct"), P("8.03B")),
    row(("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B-Instruct"), "llama-3.1", "70b", "instruct",
        (LITGPT, "Llama-3.1-70B-Instruct"), P("70.6B")),
    row(("meta-llama/Llama-3.1-405B", "meta-llama/Llama-3.1-405B-Instruct", "meta-llama/Meta-Llama-3.1-405B",
         "meta-llama/Meta-Llama-3.1-405B-Instruct"), "llama-3.1", "405b", "base", (LITGPT, "Llama-3.1-405B"),
        P("406B")),
    row("meta-llama/Llama-3.2-1B-Instruct", "llama-3.2", "1b", "instruct", (LITGPT, "Llama-3.2-1B-Instruct"),
        P("1.24B"), set=tied()),
    row("meta-llama/Llama-3.2-3B-Instruct", "llama-3.2", "3b", "instruct", (LITGPT, "Llama-3.2-3B-Instruct"),
        P("3.21B"), set=tied()),
    row("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3", "70b", "instruct", (LITGPT, "Llama-3.3-70B-Instruct"),
        P("70.6B")),
    row("nvidia/Llama-3.1-Nemotron-70B-Instruct-HF", "llama-3.1-nemotron", "70b", "instruct",
        (LITGPT, "Llama-3.1-Nemotron-70B-Instruct-HF"), P("70.6B")),
    # DeepSeek-R1 distills (the bases are those the DeepSeek-R1 model card's distillation table names)
    row("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-r1", "1.5b", "distill",
        (LITGPT, "Qwen2.5-Math-1.5B"), P("1.78B"), arch="qwen2",
        note=DISTILL.format(base="Qwen2.5-Math-1.5B"),
        set={"max_position_embeddings": (131072, "DeepSeek-R1 model card: distilled models use 128K context"),
             "tie_word_embeddings": (False, "the published 1.78B is the Qwen2.5-Math-1.5B shapes with an untied LM head")}),
    row("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "deepseek-r1", "7b", "distill", (LITGPT, "Qwen2.5-Math-7B"),
        P("7.62B"), arch="qwen2",
        note=DISTILL.format(base="Qwen2.5-Math-7B"),
        set={"max_position_embeddings": (131072, "DeepSeek-R1 model card: distilled models use 128K context")}),
    row("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "deepseek-r1", "8b", "distill", (LITGPT, "R1-Distill-Llama-8B"),
        P("8.03B"), arch="llama"),
    row("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "deepseek-r1", "14b", "distill", (LITGPT, "Qwen2.5-14B"),
        P("14.8B"), arch="qwen2",
        note=DISTILL.format(base="Qwen2.5-14B")),
    row("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "deepseek-r1", "32b", "distill", (LITGPT, "Qwen2.5-32B"),
        P("32.8B"), arch="qwen2",
        note=DISTILL.format(base="Qwen2.5-32B")),
    row("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "deepseek-r1", "70b", "distill", (LITGPT, "R1-Distill-Llama-70B"),
        P("70.6B"), arch="llama"),
    # Qwen2 and Qwen2.5 (torchtune's builders name the checkpoint they copy; base and instruct differ there)
    row("Qwen/Qwen2-0.5B-Instruct", "qwen2", "0.5b", "instruct", (TORCHTUNE, "qwen2_0_5b"), P("494M")),
    row("Qwen/Qwen2-1.5B-Instruct", "qwen2", "1.5b", "instruct", (TORCHTUNE, "qwen2_1_5b"), P("1.54B")),
    row("Qwen/Qwen2-7B-Instruct", "qwen2", "7b", "instruct", (TORCHTUNE, "qwen2_7b"), P("7.62B")),
    row("Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5", "0.5b", "instruct", (TORCHTUNE, "qwen2_5_0_5b"), P("0.49B", QWEN25)),
    row("Qwen/Qwen2.5-1.5B-Instruct", "qwen2.5", "1.5b", "instruct", (TORCHTUNE, "qwen2_5_1_5b_instruct"),
        P("1.54B", QWEN25)),
    row("Qwen/Qwen2.5-3B", "qwen2.5", "3b", "base", (LITGPT, "Qwen2.5-3B"), P("3.09B", QWEN25), set=tied()),
    row("Qwen/Qwen2.5-3B-Instruct", "qwen2.5", "3b", "instruct", (TORCHTUNE, "qwen2_5_3b"), P("3.09B", QWEN25)),
    row("Qwen/Qwen2.5-7B-Instruct", "qwen2.5", "7b", "instruct", (TORCHTUNE, "qwen2_5_7b_instruct"), P("7.61B", QWEN25)),
    row("Qwen/Qwen2.5-14B-Instruct", "qwen2.5", "14b", "instruct", (TORCHTUNE, "qwen2_5_14b_instruct"),
        P("14.7B", QWEN25)),
    row("Qwen/Qwen2.5-32B-Instruct", "qwen2.5", "32b", "instruct", (TORCHTUNE, "qwen2_5_32b_instruct"),
        P("32.8B"), P("32.5B", QWEN25, disagrees=QWEN_32_5)),
    row("Qwen/Qwen2.5-72B-Instruct", "qwen2.5", "72b", "instruct", (TORCHTUNE, "qwen2_5_72b_instruct"),
        P("72.7B", QWEN25)),
    row("Qwen/Qwen2.5-7B-Instruct-1M", "qwen2.5", "7b", "instruct", (LITGPT, "Qwen2.5-7B-Instruct-1M"),
        P("7.61B", "Qwen2.5-7B-Instruct-1M model card, 'Number of Parameters'")),
    row("Qwen/Qwen2.5-14B-Instruct-1M", "qwen2.5", "14b", "instruct", (LITGPT, "Qwen2.5-14B-Instruct-1M"),
        P("14.7B", "Qwen2.5-14B-Instruct-1M model card, 'Number of Parameters'")),
    row(("Qwen/Qwen2.5-Coder-0.5B", "Qwen/Qwen2.5-Coder-0.5B-Instruct"), "qwen2.5", "0.5b", "coder",
        (LITGPT, "Qwen2.5-Coder-0.5B"), P("0.49B", QWEN25_CODER), set=tied()),
    row(("Qwen/Qwen2.5-Coder-1.5B", "Qwen/Qwen2.5-Coder-1.5B-Instruct"), "qwen2.5", "1.5b", "coder",
        (LITGPT, "Qwen2.5-Coder-1.5B"), P("1.54B", QWEN25_CODER), set=tied()),
    row(("Qwen/Qwen2.5-Coder-3B", "Qwen/Qwen2.5-Coder-3B-Instruct"), "qwen2.5", "3b", "coder",
        (LITGPT, "Qwen2.5-Coder-3B"), P("3.09B", QWEN25_CODER), set=tied()),
    row(("Qwen/Qwen2.5-Coder-7B", "Qwen/Qwen2.5-Coder-7B-Instruct"), "qwen2.5", "7b", "coder",
        (LITGPT, "Qwen2.5-Coder-7B"), P("7.61B", QWEN25_CODER)),
    row(("Qwen/Qwen2.5-Coder-14B", "Qwen/Qwen2.5-Coder-14B-Instruct"), "qwen2.5", "14b", "coder",
        (LITGPT, "Qwen2.5-Coder-14B"), P("14.7B", QWEN25_CODER)),
    row(("Qwen/Qwen2.5-Coder-32B", "Qwen/Qwen2.5-Coder-32B-Instruct"), "qwen2.5", "32b", "coder",
        (LITGPT, "Qwen2.5-Coder-32B"), P("32.8B"), P("32.5B", QWEN25_CODER, disagrees=QWEN_32_5)),
    row(("Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-Math-1.5B-Instruct"), "qwen2.5", "1.5b", "math",
        (LITGPT, "Qwen2.5-Math-1.5B"), P("1.54B"), set=tied()),
    row(("Qwen/Qwen2.5-Math-7B", "Qwen/Qwen2.5-Math-7B-Instruct"), "qwen2.5", "7b", "math",
        (LITGPT, "Qwen2.5-Math-7B"), P("7.62B")),
    row(("Qwen/Qwen2.5-Math-72B", "Qwen/Qwen2.5-Math-72B-Instruct"), "qwen2.5", "72b", "math",
        (LITGPT, "Qwen2.5-Math-72B"), P("72.7B")),
    row("Qwen/QwQ-32B", "qwq", "32b", "reasoning", (LITGPT, "QwQ-32B"), P("32.8B"),
        P("32.5B", "QwQ-32B model card, 'Number of Parameters'", disagrees=QWEN_32_5)),
    row("Qwen/QwQ-32B-Preview", "qwq", "32b", "reasoning", (LITGPT, "QwQ-32B-Preview"),
        P("32.8B"), P("32.5B", "QwQ-32B-Preview model card, 'Number of Parameters'", disagrees=QWEN_32_5)),
    # Qwen3 dense and MoE
    row("Qwen/Qwen3-0.6B-Base", "qwen3", "0.6b", "base", (LITGPT, "Qwen3-0.6B-Base"), P("0.6B", QWEN3),
        set={**tied(), "max_position_embeddings": _MAX32K_BASE}),
    row("Qwen/Qwen3-1.7B", "qwen3", "1.7b", "instruct", (LITGPT, "Qwen3-1.7B"), P("1.7B", QWEN3), set=tied()),
    row("Qwen/Qwen3-1.7B-Base", "qwen3", "1.7b", "base", (LITGPT, "Qwen3-1.7B-Base"), P("1.7B", QWEN3),
        set={**tied(), "max_position_embeddings": _MAX32K_BASE}),
    row("Qwen/Qwen3-4B", "qwen3", "4b", "instruct", (LITGPT, "Qwen3-4B"), P("4.0B", QWEN3), set=tied()),
    row("Qwen/Qwen3-4B-Base", "qwen3", "4b", "base", (LITGPT, "Qwen3-4B-Base"), P("4.0B", QWEN3),
        set={**tied(), "max_position_embeddings": _MAX32K_BASE}),
    row(("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B-Thinking-2507"), "qwen3", "4b", "instruct",
        (LITGPT, "Qwen3-4B-Instruct-2507"), P("4.0B", QWEN3), set=tied()),
    row("Qwen/Qwen3-8B-Base", "qwen3", "8b", "base", (LITGPT, "Qwen3-8B-Base"), P("8.2B", QWEN3),
        set={"max_position_embeddings": _MAX32K_BASE}),
    row("Qwen/Qwen3-14B", "qwen3", "14b", "instruct", (LITGPT, "Qwen3-14B"), P("14.8B", QWEN3)),
    row("Qwen/Qwen3-14B-Base", "qwen3", "14b", "base", (LITGPT, "Qwen3-14B-Base"), P("14.8B", QWEN3),
        set={"max_position_embeddings": _MAX32K_BASE}),
    row("Qwen/Qwen3-32B", "qwen3", "32b", "instruct", (LITGPT, "Qwen3-32B"), P("32.8B", QWEN3)),
    row("Qwen/Qwen3-30B-A3B-Base", "qwen3", "30b-a3b", "base", (LITGPT, "Qwen3-30B-A3B-Base"),
        P("30.5B", QWEN3), P("3.3B", QWEN3_ACTIVE, "active"), set={"max_position_embeddings": _MAX32K_BASE}),
    row(("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B-Thinking-2507"), "qwen3", "30b-a3b", "instruct",
        (LITGPT, "Qwen3-30B-A3B-Instruct-2507"), P("30.5B", QWEN3), P("3.3B", QWEN3_ACTIVE, "active")),
    row("Qwen/Qwen3-235B-A22B", "qwen3", "235b-a22b", "instruct", (LITGPT, "Qwen3-235B-A22B"),
        P("235B", QWEN3), P("22B", QWEN3_ACTIVE, "active")),
    row(("Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-235B-A22B-Thinking-2507"), "qwen3", "235b-a22b",
        "instruct", (LITGPT, "Qwen3-235B-A22B-Instruct-2507"), P("235B", QWEN3), P("22B", QWEN3_ACTIVE, "active")),
    # Gemma 2 and Gemma 3 (text)
    row("google/gemma-2-2b-it", "gemma-2", "2b", "instruct", (LITGPT, "Gemma-2-2b-it"), P("2.61B"),
        P("2,024,517,888", GEMMA2, "non_embedding"), set={"rms_norm_eps": _GEMMA_EPS}),
    row("google/gemma-2-9b-it", "gemma-2", "9b", "instruct", (LITGPT, "Gemma-2-9b-it"), P("9.24B"),
        P("8,324,201,984", GEMMA2, "non_embedding"), set={"rms_norm_eps": _GEMMA_EPS}),
    row(("google/gemma-2-27b", "google/gemma-2-27b-it"), "gemma-2", "27b", "base", (LITGPT, "Gemma-2-27b"),
        P("27.2B"), P("26,047,480,320", GEMMA2, "non_embedding"), set={"rms_norm_eps": _GEMMA_EPS}),
    row("google/gemma-3-1b-it", "gemma-3", "1b", "instruct", (LITGPT, "Gemma-3-1b-it"),
        P("698M", GEMMA3, "non_embedding"),
        set={"rms_norm_eps": _GEMMA_EPS,
             "max_position_embeddings": (32768, "litgpt has 131072; the vendored gemma-3-1b-pt Hub config has 32768")}),
    row("google/gemma-3-4b-it", "gemma-3", "4b", "instruct", (LITGPT, "Gemma-3-4b-it"),
        P("3,209M", GEMMA3, "non_embedding"), set={"rms_norm_eps": _GEMMA_EPS, "vocab_size": _GEMMA3_VOCAB},
        note="Text model only (the language model of the multimodal checkpoint); the vision tower is not counted."),
    row("google/gemma-3-12b-it", "gemma-3", "12b", "instruct", (LITGPT, "Gemma-3-12b-it"),
        P("10,759M", GEMMA3, "non_embedding"), set={"rms_norm_eps": _GEMMA_EPS, "vocab_size": _GEMMA3_VOCAB},
        note="Text model only (the language model of the multimodal checkpoint); the vision tower is not counted."),
    row("google/gemma-3-27b-it", "gemma-3", "27b", "instruct", (LITGPT, "Gemma-3-27b-it"),
        P("25,600M", GEMMA3, "non_embedding"), set={"rms_norm_eps": _GEMMA_EPS, "vocab_size": _GEMMA3_VOCAB},
        note="Text model only (the language model of the multimodal checkpoint); the vision tower is not counted."),
    # Gemma (1) and CodeGemma
    row(("google/gemma-2b", "google/gemma-2b-it"), "gemma", "2b", "base", (LITGPT, "Gemma-2b"), P("2.51B"),
        P("1,981,884,416", GEMMA1, "non_embedding"),
        set={"rms_norm_eps": _GEMMA1_EPS, "max_position_embeddings": _GEMMA1_CTX}),
    row(("google/gemma-7b", "google/gemma-7b-it"), "gemma", "7b", "base", (LITGPT, "Gemma-7b"), P("8.54B"),
        P("7,751,248,896", GEMMA1, "non_embedding"),
        set={"rms_norm_eps": _GEMMA1_EPS, "max_position_embeddings": _GEMMA1_CTX}),
    row("google/codegemma-7b-it", "codegemma", "7b", "coder", (LITGPT, "CodeGemma-7b-it"), P("8.54B"),
        set={"rms_norm_eps": _GEMMA1_EPS, "max_position_embeddings": _GEMMA1_CTX}),
    # OLMo 2 (litgpt gives the base, SFT, DPO and Instruct checkpoints one config)
    row(("allenai/OLMo-2-1124-7B", "allenai/OLMo-2-1124-7B-SFT", "allenai/OLMo-2-1124-7B-DPO",
         "allenai/OLMo-2-1124-7B-Instruct"), "olmo-2", "7b", "base", (LITGPT, "OLMo-2-1124-7B"), P("7.3B")),
    row(("allenai/OLMo-2-1124-13B", "allenai/OLMo-2-1124-13B-SFT", "allenai/OLMo-2-1124-13B-DPO",
         "allenai/OLMo-2-1124-13B-Instruct"), "olmo-2", "13b", "base", (LITGPT, "OLMo-2-1124-13B"), P("13.7B")),
    # Phi-3 / 3.5 / 4
    row("microsoft/Phi-3-mini-128k-instruct", "phi-3", "3.8b", "instruct", (LITGPT, "Phi-3-mini-128k-instruct"),
        P("3.82B"), note="Long-context RoPE (longrope) factors are not in the source: rope_scaling is left out."),
    row("microsoft/Phi-3.5-mini-instruct", "phi-3.5", "3.8b", "instruct", (LITGPT, "Phi-3.5-mini-instruct"),
        P("3.82B"), set={"max_position_embeddings": (131072, "litgpt caps block_size at 4096; the model card gives a "
                                                      "128K-token context")},
        note="Long-context RoPE (longrope) factors are not in the source: rope_scaling is left out."),
    row("microsoft/phi-4", "phi-4", "14b", "base", (LITGPT, "phi-4"), P("14.7B")),
    row(("microsoft/Phi-4-reasoning", "microsoft/Phi-4-reasoning-plus"), "phi-4", "14b", "reasoning",
        (LITGPT, "Phi-4-reasoning"), P("14.7B")),
    row("microsoft/Phi-4-mini-instruct", "phi-4", "3.8b", "instruct", (LITGPT, "Phi-4-mini-instruct"), P("3.84B"),
        set=tied(), note="Long-context RoPE (longrope) factors are not in the source: rope_scaling is left out."),
    row("microsoft/Phi-4-mini-reasoning", "phi-4", "3.8b", "reasoning", (LITGPT, "Phi-4-mini-reasoning"), P("3.84B"),
        set=tied(), note="Long-context RoPE (longrope) factors are not in the source: rope_scaling is left out."),
    # Mistral and Mixtral
    row(("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"), "mistral", "7b", "base",
        (LITGPT, "Mistral-7B-v0.1"), P("7.24B"),
        set={"max_position_embeddings": (32768, "litgpt caps block_size at 4096 (its own comment: 'should be 32768')")}),
    row(("mistralai/Mistral-7B-Instruct-v0.2", "unsloth/Mistral-7B-v0.2"), "mistral", "7b", "instruct",
        (LITGPT, "Mistral-7B-Instruct-v0.2"), P("7.24B")),
    row("mistralai/Mistral-7B-Instruct-v0.3", "mistral", "7b", "instruct", (LITGPT, "Mistral-7B-Instruct-v0.3"),
        P("7.25B")),
    row("mistralai/mathstral-7B-v0.1", "mathstral", "7b", "math", (LITGPT, "Mathstral-7B-v0.1"), P("7.25B")),
    row(("mistralai/Mistral-Large-Instruct-2407", "mistralai/Mistral-Large-Instruct-2411"), "mistral-large", "123b",
        "instruct", (LITGPT, "Mistral-Large-Instruct-2407"),
        P("123B", "Mistral-Large-Instruct-2407 model card ('a dense LLM of 123B parameters')")),
    row("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral", "8x7b", "instruct", (LITGPT, "Mixtral-8x7B-Instruct-v0.1"),
        P("46.7B", MIXTRAL), P("12.9B", MIXTRAL, "active")),
    row(("mistralai/Mixtral-8x22B-v0.1", "mistralai/Mixtral-8x22B-Instruct-v0.1"), "mixtral", "8x22b", "base",
        (LITGPT, "Mixtral-8x22B-v0.1"), P("141B", MIXTRAL22), P("39B", MIXTRAL22, "active")),
    # Small models
    row(("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M-Instruct"), "smollm2", "135m", "base",
        (LITGPT, "SmolLM2-135M"), P("135M"), set=tied()),
    row(("HuggingFaceTB/SmolLM2-360M", "HuggingFaceTB/SmolLM2-360M-Instruct"), "smollm2", "360m", "base",
        (LITGPT, "SmolLM2-360M"), P("362M"), set=tied()),
    row(("HuggingFaceTB/SmolLM2-1.7B", "HuggingFaceTB/SmolLM2-1.7B-Instruct"), "smollm2", "1.7b", "base",
        (LITGPT, "SmolLM2-1.7B"), P("1.71B"), set=tied()),
    row(("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"), "tinyllama",
        "1.1b", "base", (LITGPT, "tiny-llama-1.1b"), P("1.1B"),
        sole_size="TinyLlama README (jzhang38/TinyLlama): 'The TinyLlama project aims to pretrain a 1.1B Llama model "
                  "on 3 trillion tokens'"),
    row(("tiiuae/Falcon3-1B-Base", "tiiuae/Falcon3-1B-Instruct"), "falcon3", "1b", "base", (LITGPT, "Falcon3-1B-Base"),
        P("1.67B")),
    row(("tiiuae/Falcon3-3B-Base", "tiiuae/Falcon3-3B-Instruct"), "falcon3", "3b", "base", (LITGPT, "Falcon3-3B-Base"),
        P("3.23B")),
    row(("tiiuae/Falcon3-7B-Base", "tiiuae/Falcon3-7B-Instruct"), "falcon3", "7b", "base", (LITGPT, "Falcon3-7B-Base"),
        P("7.46B")),
    row(("tiiuae/Falcon3-10B-Base", "tiiuae/Falcon3-10B-Instruct"), "falcon3", "10b", "base",
        (LITGPT, "Falcon3-10B-Base"), P("10.3B")),
    row(("BSC-LT/salamandra-2b", "BSC-LT/salamandra-2b-instruct"), "salamandra", "2b", "base",
        (LITGPT, "salamandra-2b"), P("2,253,490,176", "salamandra-2b model card, architecture table ('Total Parameters')")),
    row(("BSC-LT/salamandra-7b", "BSC-LT/salamandra-7b-instruct"), "salamandra", "7b", "base",
        (LITGPT, "salamandra-7b"), P("7,768,117,248", "salamandra-7b model card, architecture table ('Total Parameters')")),
    # Llama-architecture releases litgpt also carries (the published figure is the size in the name)
    row("openlm-research/open_llama_3b", "open-llama", "3b", "base", (LITGPT, "open_llama_3b"),
        P("3B", "OpenLLaMA README (openlm-research/open_llama): 3B, 7B and 13B models")),
    row("openlm-research/open_llama_7b", "open-llama", "7b", "base", (LITGPT, "open_llama_7b"),
        P("7B", "OpenLLaMA README (openlm-research/open_llama): 3B, 7B and 13B models")),
    row("openlm-research/open_llama_13b", "open-llama", "13b", "base", (LITGPT, "open_llama_13b"),
        P("13B", "OpenLLaMA README (openlm-research/open_llama): 3B, 7B and 13B models")),
    row("keeeeenw/MicroLlama", "microllama", "300m", "base", (LITGPT, "micro-llama-300M"),
        P("300M", "MicroLlama model card ('a 300M Llama model')")),
    row("stabilityai/FreeWilly2", "freewilly2", "70b", "instruct", (LITGPT, "FreeWilly2"),
        P("70B", "FreeWilly2 model card ('a Llama2 70B model finetuned')")),
    row("garage-bAInd/Platypus2-13B", "platypus2", "13b", "instruct", (LITGPT, "Platypus2-13B"),
        P("13B", "Platypus2-13B model card (LLaMA 2 13B fine-tune)")),
]

# ---------------------------------------------------------------- config.json copies kept in public repositories
# litgpt 0.5.13 and torchtune 0.6.1 have no config for these. Each file is the repository's copy, kept as written there
# (``owner/repo@commit:path``, ``#key`` for one entry of a table of configs).
_MLC = "mlc-ai/mlc-llm@79d603f085f50500e9509fa01785ffa7ecfaaa93:python/mlc_llm/model/model_preset.py"
_THUNDER = "kevinstephano/thunder_model_blocks@a23dd8fe87e974d06332635cfd3064614c47ae27:" \
           "thunder_model_blocks/mistral/mistral_config.py"
_TINYGRAD_GPT_OSS = "tinygrad/tinygrad@6f12ed7d21002ae1909f185351c01a7cb6eb16dc:test/models/test_gpt_oss.py"
_AIC = "ai-dynamo/aiconfigurator@095f58a51c4ca8e61b66ec108d86f223f8d559ce:aic-core/src/aiconfigurator_core/model_configs"
_CIRCUIT_TRACER = ("decoderesearch/circuit-tracer@4bb8c0ea10bde09727e14565ec8469656880da53:"
                   "tests/test_attributions_gemma3_nnsight.py")
_TRTLLM = "NVIDIA/TensorRT-LLM"
_ONNX_TOOL = "ThanatosShinji/onnx-tool@00f5f0a04df5d0988b348c27abab245eedf36d9c:onnx_tool/model_configs.py"
_ONNX_TOOL_NOTE = ("onnx-tool's copy of the Hub config.json (its table of model configs; the 'name' label it adds is left "
                   "out; its Phi-3-mini-4k-instruct copy equals the vendored Hub file key for key, and its Yi-1.5-34B "
                   "copy equals pytorchKQI's on every shape key)")
_KQI = "Girafboy/pytorchKQI"
_KQI_NOTE = ("pytorchKQI's copy of the Hub config.json (a table of Hub configs in its example; its copies of the Qwen2.5 "
             "1.5B/14B/32B and Gemma 2 2B/9B files equal the vendored Hub files key for key)")
QWEN2 = ("Qwen2 blog 'Hello Qwen2' (Jun 2024), model table of parameters and non-embedding parameters, as reproduced "
         "at besthub.dev ('What's New in Qwen2?'): 'Qwen2-57B-A14B (57.41 B total, 56.32 B non-embedding), Qwen2-72B "
         "(72.71 B total, 70.21 B non-embedding)'")
YI15 = ("Yi: Open Foundation Models by 01.AI (arXiv 2403.04652): '6B and 34B language models'; 'Yi-1.5 is an upgraded "
        "version of Yi. It is continuously pre-trained on Yi' (the Yi-1.5 card's words, as Xinference's model list "
        "quotes them with sizes 6, 9 and 34 billion: xorbitsai/inference doc/source/models/builtin/llm/yi-1.5.rst)")
_KLR = "smalltong02/keras-llm-robot@86a811b0b956496bfdd0e38c4036c65d37aef9c9:models/llm"
YI1 = "Yi: Open Foundation Models by 01.AI (arXiv 2403.04652), abstract: 'the Yi model family ... 6B and 34B pretrained language models'"
_YI_AWQ_SET = {"quantization_config": (None, "removed: the copy is of 01.AI's AWQ 4-bit release of this chat model (bits 4, "
                                             "group 128, gemm; with a disable_exllama line the repository added); "
                                             "the 16-bit checkpoint has the same layer shapes and no quantization")}
_YI_AWQ_NOTE = ("keras-llm-robot's copy of the config.json of 01-ai/{repo}, 01.AI's own AWQ release of this chat model "
                "(transformers 4.35.0; torch_dtype float16 is the AWQ compute dtype), with quantization_config left out. "
                "Its shape keys are the first Yi release's (vocabulary 64,000, rope_theta 5,000,000, rms_norm_eps 1e-5, "
                "4,096 positions). The base checkpoint (01-ai/{base}) and its 200K-context variant are entries of their own "
                "(pytorchKQI's copies of their Hub files): same layer shapes, another checkpoint.")
_KQI_LLMS = f"{_KQI}@4adb1daaa5cc32993c3150f58ec984d073c1d4cb:llms"
_KQI_LLMS_NOTE = ("pytorchKQI's copy of the Hub config.json: its llms/<org>/<name>/config.json folder keeps the Hub files "
                  "of about 200 checkpoints as the Hub writes them (2-space JSON, sorted keys); its Yi-1.5-6B, Yi-1.5-34B "
                  "and Qwen2-72B files equal the copies those entries cite key for key. Commit 4adb1daa is on the "
                  "repository's pull-request ref refs/pull/76/head (also in pull/77 and pull/80), not on master (which "
                  "has no llms/ folder): a public commit, not a merged one")
YI9B = ("01.AI blog 'Dive deeper into Yi-9B' (01-ai.github.io/blog/dive-deeper-into-yi-9b): 'We're thrilled to "
        "introduce the Yi-9B and its 200K variant'; 'Yi-9B has approximately 8.8B parameters'")
QWEN2_DENSE = ("Qwen2 blog 'Hello Qwen2' (Jun 2024), model table of parameters and non-embedding parameters, as "
               "reproduced at besthub.dev ('What's New in Qwen2?'): 'Qwen2-0.5B (0.49 B total parameters, 0.35 B "
               "non-embedding) Qwen2-1.5B (1.54 B total, 1.31 B non-embedding) Qwen2-7B (7.07 B total, 5.98 B "
               "non-embedding)'")
QWEN2_7B_TABLE = ("the blog's Qwen2-7B figures are the weights' count less one 152,064 x 3,584 matrix (544,997,376), as "
                  "if the embedding were tied: 7,615,616,512 - 544,997,376 = 7,070,619,136 and 6,525,621,760 - "
                  "544,997,376 = 5,980,624,384; this config unties it (tie_word_embeddings false), and the Hub gives the "
                  "same shapes' -Instruct weights as 7.62B")
_DINOML = "hlky/dinoml_v2@6b8c0acb3a19f77188401b57db6e403aa92534f3:agents/plans/transformers"
OLMO3 = ("Olmo 3 technical report (arXiv 2512.13961), abstract: 'a family of state-of-the-art, fully-open language "
         "models at the 7B and 32B parameter scales'")
_OLMO3_SET = {
    "layer_types": (None, "written out from the source's 'N sliding_attention, M full_attention, repeating S,S,S,F'"),
    "model_type": ("olmo3", "the same commit's olmo3/_sources/source_notes.md: model_type \"olmo3\""),
}
_OLMO3_NOTE = ("The section of this model (its Hub id as the heading) in a field-by-field listing of Hub config.json "
               "files (fetched 2026-05-13, each with the Hub commit it was read at) in a model-porting plan, written "
               "out as JSON; the listing leaves out initializer_range, "
               "bos_token_id and transformers_version, which change no shape.{also}")
_NANO = "leok7v/nano-lamma"
GRANITE3 = ("Granite 3.0 technical report, Table 1 'Hyperparameters for Granite 3.0 models' (ibm-granite/"
            "granite-3.0-language-models@5960b7fb3308588bf5f86348278ec9d6015ab647:paper.pdf): 1B-A400M '#Parameters "
            "1.3B', '#Active Parameters 400M' (the 3.1 model card repeats the table)")
GRANITE3_ACTIVE = ("The planner's active count (8 of 32 experts per layer, attention, router and the tied 49,155 x 1,024 "
                   "embedding) is 0.43B; without the embedding it is 0.38B: IBM's '400M' rounds either way, it "
                   "does not say which it counts.")
_GRANITE_MOE_NOTE = ("nano-lamma's copy of the Hub repository of {card} (config.json kept with the model card, tokenizer "
                     "and generation_config files; transformers {tv}). The -base checkpoint of this size is not listed "
                     "(another file: vocabulary 49,152, not 49,155).")


def granite3(cell: str) -> str:
    """GRANITE3's table, citing the column of another size ('8B '#Parameters 8.1B'')."""
    return GRANITE3.replace("1B-A400M '#Parameters 1.3B', '#Active Parameters 400M'", cell)


_GRANITE_SRC = f"{_DINOML}/granite/_sources/ibm-granite__{{name}}.config.json"
_GRANITEMOE_SRC = f"{_DINOML}/granitemoe/_sources/ibm-granite_{{name}}_config.json"
_GRANITE_NOTE = ("A model-porting plan's copy of the Hub config.json, saved beside a metadata.json that records the Hub "
                 "commit it was read at ({sha}); transformers {tv}. The same folder's granite-3.3-8b-instruct copy "
                 "equals vllm-spyre's (the granite-3.3-8b-instruct entry) key for key but transformers_version.")
_GRANITEMOE_NOTE = ("A model-porting plan's copy of the Hub config.json (transformers {tv}; no Hub commit recorded for "
                    "this folder); its 3.0-1B-A400M-base copy has the shape keys of nano-lamma's -instruct copy (the "
                    "granite-3.0-1b-a400m-instruct entry) but vocabulary 49,152.")
GRANITE_BASE_VOCAB = ("Granite 3.0-3.2 -instruct files have vocabulary 49,155 against the -base's 49,152 (the "
                      "catalog's 3.0-8b, 3.2-8b and 1B-A400M instruct files): an -instruct name is planned with this "
                      "config only with a note saying so; pass its own config.json for its exact vocabulary.")
GRANITE3_3B_ACTIVE = ("The planner's active count (8 of 40 experts per layer, attention, router and the tied 49,152 x "
                      "1,536 embedding) is 0.88B; without the embedding it is 0.81B: IBM's '800M' rounds either way, "
                      "it does not say which it counts.")
QWEN3_CODER_480B = ("Qwen3-Coder-480B-A35B-Instruct model card (Hub), 'Model Overview': 'Number of Parameters: 480B in "
                    "total and 35B activated'")
QWEN3_CODER = ("Qwen3-Coder-30B-A3B-Instruct model card (as the Continue notes copy it, and the card's own 'Model "
               "Overview'): 'Number of Parameters: 30.5B in total and 3.3B activated'")
_PHI35_MOE = "xinyuwei-david/david-share@e1ccd3ef5cafccf747810d6ae64a5d4a6975c152:Deep-Learning/Phi-3.5-MoE-and-Mini-Fine-tuning/readme.md"
PHI35_MOE = ("Phi-3.5-MoE-instruct model card (as Azure's model catalog copies it: Azure/azureml-assets "
             "assets/models/system/phi-3.5-moe-128k-instruct/description.md): 'Phi-3.5-MoE has 16x3.8B parameters "
             "with 6.6B active parameters when using 2 experts'")
SMOLLM3 = ("Hugging Face blog 'SmolLM3: smol, multilingual, long-context reasoner' (huggingface/blog smollm3.md): "
           "'we're excited to contribute a new competitive fully open 3B model'")
QWEN2_MOE = "Qwen2-57B-A14B model card (Hub): 'the 57B-A14B Mixture-of-Experts Qwen2 base language model'"
MISTRAL_SMALL_31 = ("Mistral-Small-3.1-24B-Instruct-2503 model card (Hub): 'With 24 billion parameters, this model "
                    "achieves top-tier capabilities in both text and vision tasks'")
GPT_OSS_120B = ("OpenAI gpt-oss-120b model card: 117B total parameters, 5.1B active per token (as listed at "
                "llmdb.com/models/gpt-oss-120b: '117B total (5.1B active per token)')")
GEMMA3_270M = ("Google Developers Blog, 'Introducing Gemma 3 270M' (Aug 2025): 'a total of 270 million parameters: "
               "170 million embedding parameters ... and 100 million for our transformer blocks' (quoted at "
               "aiportalx.com/google-deepmind/gemma-3-270m)")
GPT_OSS_ACTIVE = ("OpenAI counts active parameters without the input embedding (a 201,088 x 2,880 lookup, 579,133,440 "
                  "parameters); the planner's active count counts it: less it, {value} rounds to the card's figure")

_OLMO = "allenai/OLMo@59a53e3f68e546330ca5a99ec626e58f9ab96494"
_OLMO_CONVERTERS = {
    "": "02b71586881f3ae6bb75d4d5091280a2c960cb8e:src/transformers/models/olmo/convert_olmo_weights_to_hf.py",
    "2": "0195d72e196102f02c382a38530e47c00ecb0ca8:src/transformers/models/olmo2/convert_olmo2_weights_to_hf.py",
}
_OLMO_CONVERT = ("converted as transformers' converter does it (huggingface/transformers@{where}: "
                 "hidden d_model, layers n_layers, heads and key/value heads n_heads, intermediate mlp_hidden_size / 2 "
                 "(or d_model x mlp_ratio / 2: SwiGLU's two halves), vocab_size embedding_size, positions "
                 "max_sequence_length, tie_word_embeddings weight_tying, rope_theta (default 10,000), {extra}pad and eos "
                 "ids as the file gives them)")

ROWS += [
    row("EleutherAI/gpt-j-6b", "gpt-j", "6b", "base", (GITHUB, f"{_MLC}#gpt_j"),
        P("6B", "EleutherAI/gpt-j-6b model card: '6B represents the number of parameters of this particular "
                "pre-trained model'"),
        P("6,053,381,344", "EleutherAI/gpt-j-6b model card, Model Details: 'n_parameters 6,053,381,344' (28 layers, "
                           "d_model 4,096, d_ff 16,384, 16 heads of 256, RoPE on 64 dims of each head)",
          disagrees="transformers' GPTJForCausalLM built from this config (meta device) has 6,050,882,784 parameters, "
                    "as the planner counts: every shape the card lists agrees, and the card's figure is 2,498,560 "
                    "(0.04%) more, as counted by mesh-transformer-jax, which is not available offline to check"),
        note="mlc-llm's MODEL_PRESETS copy of the Hub config.json (transformers 4.18.0.dev0) without the "
             "'rope_scaling': {'rope_type': 'gptj'} mlc-llm adds for its own loader (the Hub file has no such key; "
             "transformers' GPT-J reads none). The vocabulary is padded to 50,400 (the tokenizer's 50,257 used).",
        sole_size="EleutherAI/gpt-j-6b model card: 'GPT-J refers to the class of models, while 6B represents the "
                  "number of parameters of this particular pre-trained model' (the one GPT-J release)"),
    # OLMo 1: LayerNorms without weight or bias; 0424 / 0724 add clip_qkv and 4,096 positions
    row("allenai/OLMo-1B-hf", "olmo", "1b", "base", (LITGPT, "OLMo-1B-hf"),
        P("1B", f"{_OLMO}:configs/official-0724/OLMo-1B.yaml: Ai2's official config of the 1B"),
        set=tied(f"{_OLMO}:configs/official-0724/OLMo-1B.yaml: 'weight_tying: true' (transformers' converter writes "
                 "it as tie_word_embeddings; litgpt does not record it)"),
        note="litgpt's config (vocabulary padded to 50,304, as the official config's embedding_size and the Hub "
             "config.json's vocab_size), keys as transformers' OLMo converter writes them."),
    row(("allenai/OLMo-7B-hf", "allenai/OLMo-7B-Instruct-hf"), "olmo", "7b", "base", (LITGPT, "OLMo-7B-hf"),
        P("7B", f"{_OLMO}:configs/official-0724/OLMo-7B.yaml: Ai2's official config of the 7B"),
        note="litgpt's config; its OLMo-7B-Instruct-hf entry has the same shapes, listed here (an instruct "
             "sibling). Untied head: the official config's 'weight_tying: false'."),
    *(row(f"allenai/OLMo-7B-{release}-hf", "olmo", "7b", "base",
          (GITHUB, f"{_OLMO}:configs/official-0724/OLMo-7B-{release}.yaml"),
          P("7B", f"{_OLMO}:configs/official-0724/OLMo-7B-{release}.yaml: Ai2's official config of OLMo 7B {month}"),
          note="Ai2's official training config (model section), "
               + _OLMO_CONVERT.format(where=_OLMO_CONVERTERS[""], extra="clip_qkv 8.0, ")
               + ". OLMo 1.7: q, k and v clamped to +-8, 4,096 positions; the 0424 and 0724 model sections are "
                 "the same, key for key.")
      for release, month in (("0424", "April 2024"), ("0724", "July 2024"))),
    row(("allenai/OLMo-2-0425-1B", "allenai/OLMo-2-0425-1B-Instruct"), "olmo-2", "1b", "base",
        (GITHUB, f"{_OLMO}:configs/official-0425/OLMo2-1B-stage1.yaml"),
        P("1B", f"{_OLMO}:README.md: 'OLMo-2 1B', released with its Instruct sibling ('OLMo2 1B Instruct')"),
        note="Ai2's official OLMo 2 1B training config (model section), "
             + _OLMO_CONVERT.format(where=_OLMO_CONVERTERS["2"], extra="rms_norm_eps layer_norm_eps, ")
             + ". The same conversion of the 7B's official config (configs/official-1124/OLMo2-7B-stage1.yaml) gives "
               "the bundled allenai/OLMo-2-1124-7B config key for key. The -Instruct checkpoint is read with this "
               "config (an instruct/base sibling)."),
    row(("allenai/OLMo-2-0325-32B", "allenai/OLMo-2-0325-32B-Instruct"), "olmo-2", "32b", "base",
        (GITHUB, f"{_MLC}#olmo2_32b"),
        P("32B", "Ai2 blog 'OLMo 2 32B: First fully open model to outperform GPT 3.5 and GPT 4o mini' (Mar 2025; "
                 "allenai.org/blog/olmo2-32B): 'available in 7B, 13B, and 32B parameter sizes'"),
        note="mlc-llm's MODEL_PRESETS copy of the Hub config.json (transformers 4.49.0); the -SFT/-DPO/-Instruct "
             "checkpoints are read with this config (instruct/base siblings; the -Instruct is listed, as "
             f"{_OLMO}:README.md links it: 'OLMo2 32B Instruct')."),
    row(("mistralai/Mistral-Nemo-Base-2407", "mistralai/Mistral-Nemo-Instruct-2407"), "mistral-nemo", "12b", "base",
        (GITHUB, f"{_THUNDER}#mistral_cfg_str"),
        P("12B", "Mistral-Nemo-Base-2407 model card ('a pretrained generative text model of 12B parameters'; layers "
                 "40, dim 5,120, head dim 128, 32 heads, 8 kv-heads, vocabulary 2**17)"),
        note="A copy of the Hub config.json written by transformers 4.43.3 (max_position_embeddings 128000, the "
             "128k context of the card; later Hub revisions say 1024000 — shapes and counts are the same). "
             "Mistral-Nemo-Instruct-2407 is read with this config (an instruct/base sibling). Every shape agrees "
             "with the model card (layers 40, dim 5,120, head dim 128, 32 heads, 8 kv-heads, vocabulary 2**17) and "
             "with NVIDIA NeMo's MistralNeMo2407Config12B (NVIDIA/NeMo@09d2252fd8f5bface4ce5ac51f055614b73912c9:"
             "nemo/collections/llm/gpt/model/mistral.py: ffn 14336, rotary base 1e6).",
        sole_size="Mistral AI, 'Mistral NeMo' (mistral.ai/news/mistral-nemo, Jul 2024): 'Today, we are excited to "
                  "release Mistral NeMo, a 12B model built in collaboration with NVIDIA ... We have released "
                  "pre-trained base and instruction-tuned checkpoints'"),
    row("openai/gpt-oss-20b", "gpt-oss", "20b", "instruct", (GITHUB, f"{_TINYGRAD_GPT_OSS}#TORCH_PARAMS"),
        P("21B", "OpenAI gpt-oss-20b model card (Hub): '21B parameters with 3.6B active parameters'"),
        P("3.6B", "OpenAI gpt-oss-20b model card (Hub): '21B parameters with 3.6B active parameters'", counts="active",
          disagrees=GPT_OSS_ACTIVE.format(value="3,608,307,264")),
        note="tinygrad's test copy of the Hub config.json (transformers 4.57.0; its source comment links "
             "huggingface.co/openai/gpt-oss-20b/blob/main/config.json). The published experts are MXFP4 "
             "(quantization_config): Aegis plans and trains bf16 dequantised weights."),
    row("openai/gpt-oss-120b", "gpt-oss", "120b", "instruct", (GITHUB, f"{_AIC}/openai--gpt-oss-120b_config.json"),
        P("117B", GPT_OSS_120B),
        P("5.1B", GPT_OSS_120B, counts="active", disagrees=GPT_OSS_ACTIVE.format(value="5,132,849,472")),
        note="NVIDIA aiconfigurator's copy of the Hub config.json (transformers 4.55.0.dev0); its gpt-oss-20b copy "
             "agrees with tinygrad's on every key but transformers_version. The published experts are MXFP4 "
             "(quantization_config): Aegis plans and trains bf16 dequantised weights."),
    row("google/gemma-3-270m", "gemma-3", "270m", "base", (GITHUB, f"{_CIRCUIT_TRACER}#gemma_3_config_dict"),
        P("270M", GEMMA3_270M), P("100M", GEMMA3_270M, counts="non_embedding"),
        note="circuit-tracer's test copy of the Hub config.json (transformers 4.55.0.dev0), written beside "
             "AutoConfig.from_pretrained('google/gemma-3-270m') in the same test; its '_name_or_path' (a test "
             "placeholder, 'openai-community/gpt2') is left out. Tied embeddings (Gemma3TextConfig's default). The "
             "-it checkpoint is not listed: its config was not available offline to compare."),
    row("Qwen/Qwen2-0.5B", "qwen2", "0.5b", "base", (GITHUB, f"{_KQI_LLMS}/Qwen/Qwen2-0.5B/config.json"),
        P("0.49B", QWEN2_DENSE), P("0.35B", QWEN2_DENSE, counts="non_embedding"),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.40.1; eos 151643 and 131072 positions: the base checkpoint's file). "
             "The Qwen2-0.5B-Instruct entry (torchtune's builder) has the same shapes."),
    row("Qwen/Qwen2-1.5B", "qwen2", "1.5b", "base", (GITHUB, f"{_KQI_LLMS}/Qwen/Qwen2-1.5B/config.json"),
        P("1.54B", QWEN2_DENSE), P("1.31B", QWEN2_DENSE, counts="non_embedding"),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.40.1; eos 151643 and 131072 positions: the base checkpoint's file). "
             "The Qwen2-1.5B-Instruct entry (torchtune's builder) has the same shapes."),
    row("Qwen/Qwen2-7B", "qwen2", "7b", "base", (GITHUB, f"{_KQI_LLMS}/Qwen/Qwen2-7B/config.json"),
        P("7.07B", QWEN2_DENSE, disagrees=QWEN2_7B_TABLE),
        P("5.98B", QWEN2_DENSE, counts="non_embedding", disagrees=QWEN2_7B_TABLE),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.37.2; eos 151643 and 131072 positions: the base checkpoint's file). "
             "The Qwen2-7B-Instruct entry (torchtune's builder) has the same shapes; the planner's count, "
             "7,615,616,512, rounds to its 7.62B."),
    row("Qwen/Qwen2-57B-A14B", "qwen2", "57b-a14b", "base",
        (GITHUB, f"{_TRTLLM}@08b2040cf2c07e4d057af1da8fef88e4e497767d:tests/unittest/_torch/modeling/"
                 "test_modeling_qwen_moe.py#QWEN2_57B_A14B_CONFIG"),
        P("57.41B", QWEN2), P("56.32B", QWEN2, counts="non_embedding"), P("14B", QWEN2_MOE, counts="active"),
        note="TensorRT-LLM's test copy of the Hub config.json (transformers 4.40.1; eos 151643 and 131072 positions: "
             "the base checkpoint's file). Qwen2-57B-A14B-Instruct is an entry of its own (pytorchKQI's copy of its "
             "Hub file: the same shapes)."),
    row("Qwen/Qwen2-57B-A14B-Instruct", "qwen2", "57b-a14b", "instruct",
        (GITHUB, f"{_KQI_LLMS}/Qwen/Qwen2-57B-A14B-Instruct/config.json"),
        P("57.41B", QWEN2), P("56.32B", QWEN2, counts="non_embedding"), P("14B", QWEN2_MOE, counts="active"),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.40.1; the file has no trailing newline). The Qwen2-57B-A14B base "
             "file's shapes (64 experts of width 2,560, 8 per token, a shared expert of width 20,480) with 32,768 "
             "positions and sliding_window 65,536 (unused: use_sliding_window false); the blog's figures are for "
             "the size, whose card says 'For each size, we release the base language model and the aligned chat "
             "model'."),
    row("Qwen/Qwen2-72B", "qwen2", "72b", "base", (GITHUB, f"{_KQI}@3ad135e48fc4dcaaa9bf454fc386560dcd05a155:"
                                                           "example/evaluate.py#Qwen2_72B"),
        P("72.71B", QWEN2), P("70.21B", QWEN2, counts="non_embedding"),
        note=f"{_KQI_NOTE} (transformers 4.40.1; eos 151643 and 131072 positions: the base checkpoint's file; the "
             "copy left the file at a later commit). The -Instruct checkpoint is not listed: its config (32768 "
             "positions, rms_norm_eps 1e-6) is another file."),
    row("Qwen/Qwen2-72B-Instruct", "qwen2", "72b", "instruct", (GITHUB, f"{_ONNX_TOOL}#Qwen2_72B_Instruct"),
        P("72.71B", QWEN2), P("70.21B", QWEN2, counts="non_embedding"),
        note=f"{_ONNX_TOOL_NOTE} (transformers 4.40.1; eos 151645, 32768 positions, rms_norm_eps 1e-6: not the base "
             "file, same shapes)."),
    row("microsoft/Phi-3-medium-4k-instruct", "phi-3", "14b", "instruct", (GITHUB, f"{_ONNX_TOOL}#Phi_3_medium_4k_instruct"),
        P("14B", "Phi-3-medium-4k-instruct model card (Hub): 'The Phi-3-Medium-4K-Instruct is a 14B parameters, "
                 "lightweight, state-of-the-art open model'"),
        note=f"{_ONNX_TOOL_NOTE} (transformers 4.39.3). Phi-3-medium-128k-instruct (longrope scaling) is another "
             "config and is not listed."),
    row("microsoft/Phi-3.5-MoE-instruct", "phi-3.5-moe", "16x3.8b", "instruct", (GITHUB, _PHI35_MOE),
        P("41.9B", "Hugging Face Hub model page of microsoft/Phi-3.5-MoE-instruct, as quoted in the source: "
                   "'microsoft/Phi-3.5-MoE-instruct: 41.9B params'"),
        P("6.6B", PHI35_MOE, counts="active"),
        set={"rope_scaling": (None, "the listing gives LongRoPE (type longrope, original_max_position_embeddings "
                                    "4096) but not the values of its 64-entry short/long factor lists: left out. "
                                    "RoPE factors change no shape, count or memory; pass the Hub config.json to "
                                    "train at long context with the published scaling"),
             "auto_map": (None, "the listing's auto_map (the Hub's custom code) is left out: transformers "
                                "4.46 and later build phimoe natively")},
        note="A key-by-key listing of the Hub config.json (transformers 4.43.3) in a fine-tuning write-up, written "
             "out as JSON. attention_bias and lm_head_bias true agree with vLLM's PhiMoE, which builds qkv, o_proj "
             "and lm_head with bias=True (vllm-project/vllm@01524004c3c9e11dc14e59ef0069183dd4fcb0ec:"
             "vllm/model_executor/models/phimoe.py); every shape key equals transformers' PhimoeConfig defaults, "
             "which its docstring says match this checkpoint. The biases add 359,744 parameters, below the "
             "published figures' rounding: the count cannot confirm them."),
    row("mistralai/Ministral-8B-Instruct-2410", "ministral", "8b", "instruct",
        (GITHUB, "NX-AI/mlstm_kernels@39d3c61741e5d2c0e6ab8922106dd236632c5139:mlstm_kernels/utils/benchmark/"
                 "benchmarks/huggingface_model_configs.py#ministral8b_config"),
        P("8,019,808,256", "Ministral-8B-Instruct-2410 model card (Hub), 'Ministral 8B Architecture' table: "
                           "'Parameters | 8,019,808,256'"),
        note="mlstm_kernels' benchmark copy of the Hub config.json (transformers 4.46.0.dev0; its _name_or_path names "
             "mistralai/Ministral-8B-Instruct-2410), model_type mistral with one 32,768-token window on every layer "
             "and 32,768 positions. The card describes a 128k context with a ragged (128k, 32k, 32k, 32k) window "
             "pattern, which this file does not encode: windows change no count, and memory only past 32k tokens. "
             "Pass a config.json with layer_types (model_type ministral) to plan that pattern."),
    row("HuggingFaceTB/SmolLM3-3B", "smollm3", "3b", "instruct",
        (GITHUB, "fetchwiki/HuggingFaceTB-SmolLM3-3B@24f7882f92998ee0e691d105ade637afc3e5171f:config.json"),
        P("3B", SMOLLM3),
        sole_size=SMOLLM3 + "; base and instruct checkpoints of that one size",
        note="A GitHub mirror of the Hub repository's metadata files, config.json kept as published (transformers "
             "4.54.0.dev0; no tie_word_embeddings key: SmolLM3Config's default, tied). The mirror's "
             "model_files.json lists two bf16 safetensors files with 326 tensors and 6,150,235,008 bytes: 2 x "
             "3,075,098,624 parameters = 6,150,197,248 bytes, leaving 37,760 bytes for the two JSON headers. "
             "SmolLM3-3B-Base is not listed: its config was not available offline to compare."),
    row("01-ai/Yi-1.5-6B", "yi-1.5", "6b", "base", (GITHUB, f"{_KQI}@963269026663521e774249c3828f9e000bb2a405:"
                                                          "example/evaluate.py#Yi_1_5_6B"),
        P("6B", YI15), note=f"{_KQI_NOTE} (transformers 4.37.2). Yi-1.5-6B-Chat is an entry of its own (pytorchKQI's "
                            "copy of its Hub file: the same shapes)."),
    row("01-ai/Yi-1.5-6B-Chat", "yi-1.5", "6b", "instruct", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-1.5-6B-Chat/config.json"),
        P("6B", YI15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.40.0). The Yi-1.5-6B base file's keys and values but use_cache "
             "false: the same shapes."),
    row("01-ai/Yi-1.5-34B", "yi-1.5", "34b", "base", (GITHUB, f"{_KQI}@963269026663521e774249c3828f9e000bb2a405:"
                                                            "example/evaluate.py#Yi_1_5_34B"),
        P("34B", YI15), note=f"{_KQI_NOTE} (transformers 4.37.2). Yi-1.5-34B-Chat, -Chat-16K and -32K are entries "
                             "of their own (pytorchKQI's copies of their Hub files)."),
    row("01-ai/Yi-1.5-34B-Chat", "yi-1.5", "34b", "instruct", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-1.5-34B-Chat/config.json"),
        P("34B", YI15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.40.0). The Yi-1.5-34B base file's keys and values but use_cache "
             "false: the same shapes. Listed so that the -Chat name is its own checkpoint, never -Chat-16K's."),
    row("01-ai/Yi-1.5-34B-Chat-16K", "yi-1.5", "34b", "instruct",
        (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-1.5-34B-Chat-16K/config.json"), P("34B", YI15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.40.0). Yi-1.5-34B's shapes with 16,384 positions (rope_theta "
             "5,000,000 unchanged, no pad_token_id)."),
    row("01-ai/Yi-1.5-34B-32K", "yi-1.5", "34b", "base", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-1.5-34B-32K/config.json"),
        P("34B", YI15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.37.1). Yi-1.5-34B's shapes with 32,768 positions (rope_theta "
             "5,000,000 unchanged, no pad_token_id)."),
    row("01-ai/Yi-1.5-9B", "yi-1.5", "9b", "base", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-1.5-9B/config.json"),
        P("9B", YI15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.37.2). Yi-9B's shapes with Yi-1.5's rope_theta 5,000,000: the "
             "planner's count, 8,829,407,232, is the one LLaMA-Factory logged for Yi-9B (the 01-ai/Yi-9B entry). "
             "-Chat, -Chat-16K and -32K are entries of their own."),
    row("01-ai/Yi-1.5-9B-Chat", "yi-1.5", "9b", "instruct", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-1.5-9B-Chat/config.json"),
        P("9B", YI15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.40.0). The Yi-1.5-9B base file's keys and values but use_cache "
             "false: the same shapes."),
    row("01-ai/Yi-1.5-9B-Chat-16K", "yi-1.5", "9b", "instruct",
        (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-1.5-9B-Chat-16K/config.json"), P("9B", YI15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.40.0). Yi-1.5-9B's shapes with 16,384 positions (rope_theta "
             "5,000,000 unchanged, no pad_token_id)."),
    row("01-ai/Yi-1.5-9B-32K", "yi-1.5", "9b", "base", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-1.5-9B-32K/config.json"),
        P("9B", YI15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.37.1). Yi-1.5-9B's shapes with 32,768 positions (rope_theta "
             "5,000,000 unchanged, no pad_token_id)."),
    row("01-ai/Yi-6B", "yi", "6b", "base", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-6B/config.json"), P("6B", YI1),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.34.0). The first Yi release's base checkpoint; the Yi-6B-Chat entry "
             "has its layer shapes."),
    row("01-ai/Yi-6B-Chat", "yi", "6b", "instruct", (GITHUB, f"{_KLR}/Yi-6B-Chat-4bits/config.json"),
        P("6B", YI1), set=_YI_AWQ_SET, note=_YI_AWQ_NOTE.format(repo="Yi-6B-Chat-4bits", base="Yi-6B")),
    row("01-ai/Yi-6B-200K", "yi", "6b", "base", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-6B-200K/config.json"), P("6B", YI1),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.34.0). Yi-6B's shapes with 200,000 positions and rope_theta "
             "10,000,000."),
    row("01-ai/Yi-34B", "yi", "34b", "base", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-34B/config.json"), P("34B", YI1),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.34.0). The first Yi release's base checkpoint; the Yi-34B-Chat entry "
             "has its layer shapes."),
    row("01-ai/Yi-34B-Chat", "yi", "34b", "instruct", (GITHUB, f"{_KLR}/Yi-34B-Chat-4bits/config.json"),
        P("34B", YI1), set=_YI_AWQ_SET, note=_YI_AWQ_NOTE.format(repo="Yi-34B-Chat-4bits", base="Yi-34B")),
    row("01-ai/Yi-34B-200K", "yi", "34b", "base", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-34B-200K/config.json"),
        P("34B", YI1),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.34.0). Yi-34B's shapes with 200,000 positions and rope_theta "
             "10,000,000."),
    row("01-ai/Yi-9B", "yi", "9b", "base",
        (GITHUB, "ustcchx/Yi-9B-Understanding-Shopping-Concepts@09089d5fa6efe1910f44b1b02ae004cc5520debf:"
                 "slurm-out/export-post-pt-slurm.out"),
        P("8,829,407,232", "the same log: LLaMA-Factory's 'all params: 8829407232' for the loaded checkpoint, after "
                           "transformers' 'All model checkpoint weights were used when initializing LlamaForCausalLM'"),
        note="The config.json of a local Yi-9B download as transformers printed it on loading ('loading configuration "
             "file Yi-9B/config.json' then 'Model config LlamaConfig {...}') in a LLaMA-Factory export log, kept as "
             "printed: _name_or_path is the local folder and transformers_version (4.39.0) the library that printed "
             "it. Yi-9B has rope_theta 10,000 and rms_norm_eps 1e-6, not Yi-6B/34B's 5,000,000 and 1e-5."),
    row("01-ai/Yi-9B-200K", "yi", "9b", "base", (GITHUB, f"{_KQI_LLMS}/01-ai/Yi-9B-200K/config.json"),
        P("8.8B", YI9B),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.37.2). Yi-9B's shapes with 262,144 positions and rope_theta "
             "10,000,000; the planner's count equals Yi-9B's, 8,829,407,232."),
    row(("allenai/Olmo-3-7B-Instruct", "allenai/Olmo-3-7B-Think"), "olmo-3", "7b", "instruct",
        (GITHUB, f"{_DINOML}/olmo3/_sources/hf_config_snapshots.md"),
        P("7B", OLMO3), set=_OLMO3_SET, note=_OLMO3_NOTE.format(
            also=" Its Olmo-3-7B-Think entry reads 'Same operator-significant model dimensions as "
                 "Olmo-3-7B-Instruct', so that id shares this config.")),
    row("allenai/Olmo-3-32B-Think", "olmo-3", "32b", "reasoning",
        (GITHUB, f"{_DINOML}/olmo3/_sources/hf_config_snapshots.md"),
        P("32B", OLMO3), set=_OLMO3_SET, note=_OLMO3_NOTE.format(also="")),
    row(("ByteDance-Seed/Seed-OSS-36B-Instruct", "ByteDance-Seed/Seed-OSS-36B-Base"), "seed-oss", "36b", "instruct",
        (GITHUB, f"{_DINOML}/seed_oss/config_sweep.md"),
        P("36,151,104,512", "the source's 'params/index' column (the Hub safetensors index of each repository): "
                            "36151104512"),
        P("36B", "ByteDance-Seed/seed-oss@02d7aaaa998a311582b2a74e2b02bd1b68c92461:README.md, Model Summary table: "
                 "'Parameters 36B'"),
        set={"attention_dropout": (0.1, "the source's report.md: 'Dropout fields are nonzero in configs'; the value "
                                        "is SeedOssConfig's default"),
             "residual_dropout": (0.1, "as attention_dropout"),
             "rms_norm_eps": (1e-06, "the source's report.md (same commit): rms_norm_eps 1e-6"),
             "transformers_version": ("4.55.0", "the source's report.md: 'Public checkpoint configs report "
                                                "transformers_version 4.55.0'"),
             "model_type": ("seed_oss", "the table's model_type column")},
        sole_size="ByteDance-Seed/seed-oss@02d7aaaa998a311582b2a74e2b02bd1b68c92461:README.md: the release is "
                  "Seed-OSS-36B-Base, -Base-woSyn and -Instruct, one size",
        note="A table of the Hub config.json fields of Seed-OSS-36B-Instruct and -Base (identical rows; fetched "
             "2026-05-13) and the keys 'all three configs contained', in a model-porting plan, written out as JSON. "
             "Token ids, initializer_range and pretraining_tp are not recorded (they change no shape). The "
             "parameter count the source read from each repository's safetensors index equals the planner's "
             "exactly, which confirms every shape key."),
    row("mistralai/Mistral-Small-3.1-24B-Instruct-2503", "mistral-small-3.1", "24b", "instruct",
        (GITHUB, f"{_TRTLLM}@0373e5a1d2d9e154bb878d6dce47f52194a4963e:tests/unittest/_torch/modeling/"
                 "test_modeling_mistral.py#mistral_small_3_1_24b_config"),
        P("24B", MISTRAL_SMALL_31),
        set={"num_hidden_layers": (40, "the fixture runs 4 layers; its own comment gives the checkpoint's: "
                                        "'Reduce this from the original 40 to relieve memory needs for CI'")},
        note="Text model only: the text_config (model_type mistral) of TensorRT-LLM's test copy of the multimodal "
             "Mistral3ForConditionalGeneration Hub config.json (transformers 4.50.0.dev0); the Pixtral vision "
             "tower and projector are not counted. Mistral Small 3 (24B-2501, 32k positions, rope_theta 1e8) and "
             "the 22B 2409 are other configs and are not listed.",
        sole_size="Mistral AI's Small 3.1 release (Mar 2025, as reported at app.actuia.com): 'Like its predecessor, "
                  "Small 3.1 has 24 billion parameters'; 'available in two formats': Instruct and Base"),
    row("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3-coder", "30b-a3b", "coder",
        (GITHUB, "ztxz16/fastllm@f8f04c33abb63f6cd4e45f9427a55949a8ebbb44:Qwen3-Coder-30B-A3B-Instruct/config.json"),
        P("30.5B", QWEN3_CODER), P("3.3B", QWEN3_CODER, "active"),
        note="fastllm's copy of the Hub config.json (transformers 4.52.3); sagui-nlp/nanoGPT-moe@2675cf4c69f867983cca63c"
             "64bb7c46dfef122a1 keeps the same file at the same path, key for key. Qwen3-30B-A3B's shapes with 262,144 "
             "positions and rope_theta 1e7."),
    row("Qwen/Qwen3-Coder-480B-A35B-Instruct", "qwen3-coder", "480b-a35b", "coder",
        (GITHUB, f"{_AIC}/Qwen--Qwen3-Coder-480B-A35B-Instruct_config.json"),
        P("480B", QWEN3_CODER_480B), P("35B", QWEN3_CODER_480B, "active"),
        note="NVIDIA aiconfigurator's copy of the Hub config.json (transformers 4.51.0), at the commit the gpt-oss-120b "
             "entry cites; the file is unchanged since it was added (2025-11-03). It has the key set of fastllm's "
             "Qwen3-Coder-30B-A3B-Instruct copy (decoder_sparse_step, qkv_bias, use_qk_norm, "
             "shared_expert_intermediate_size 0, 262,144 positions, rope_theta 1e7): 62 layers, hidden 6,144, 96 "
             "query and 8 KV heads of 128, 160 experts of width 2,560, 8 per token, untied embeddings."),
    row("mistralai/Mistral-Small-24B-Instruct-2501", "mistral-small-3", "24b", "instruct",
        (GITHUB, "OpenMOSE/RWKV-LM-RLHF@c394e06d2ea0fdad4679af83b9dd77b517a87f49:main/tokenizer/mistralsmall3/"
                 "params.json"),
        P("23,572,403,200", "the same folder's model.safetensors.index.json (@7e8f62ab3f43bd70de656d5205d1cb4216b4ea58): "
                            "total_size 47,144,806,400 bytes of bf16 tensors, lm_head.weight listed apart from "
                            "embed_tokens"),
        P("24B", "its model card (the same folder's README.md): 'Mistral Small 3 ( 2501 ) ... boasting 24B parameters'"),
        set={"max_position_embeddings": (32768, "params.json's max_seq_len; the card: 'A 32k context window'"),
             "tie_word_embeddings": (False, "MistralConfig's default; the weight index lists lm_head.weight")},
        note="The Hub repository's params.json (Mistral's own format; a copy kept with its tokenizer, generation "
             "config, weight index and model card) converted as transformers' convert_config does it "
             "(huggingface/transformers@593cca32c56ade57f6db236d4b093767ca879245:src/transformers/models/mistral/"
             "convert_mistral_weights_to_hf.py: dim, n_layers, hidden_dim, n_heads, n_kv_heads, norm_eps, head_dim, "
             "vocab_size, rope_theta; no sliding window), other keys MistralConfig's defaults. The count equals "
             "the weight index's exactly. The -Base-2501 checkpoint is read with this config (an instruct/base "
             "sibling)."),
    row("ibm-granite/granite-3.0-2b-base", "granite-3.0", "2b", "base",
        (GITHUB, _GRANITE_SRC.format(name="granite-3.0-2b-base")), P("2.5B", granite3("2B '#Parameters 2.5B'")),
        note=_GRANITE_NOTE.format(sha="a8462c21f5e1f27be4536dc36d6cc789da23fbd6", tv="4.45.0.dev0")
        + " The -instruct checkpoint is not listed: its config was not available offline. " + GRANITE_BASE_VOCAB),
    row("ibm-granite/granite-3.0-8b-base", "granite-3.0", "8b", "base",
        (GITHUB, _GRANITE_SRC.format(name="granite-3.0-8b-base")), P("8.1B", granite3("8B '#Parameters 8.1B'")),
        note=_GRANITE_NOTE.format(sha="4fad7f8ad56393dcef4e34e37a35962bd091f320", tv="4.45.0.dev0")
        + " The granite-3.0-8b-instruct entry has its layer shapes and vocabulary 49,155 (this file: 49,152)."),
    row("ibm-granite/granite-3.1-8b-base", "granite-3.1", "8b", "base",
        (GITHUB, _GRANITE_SRC.format(name="granite-3.1-8b-base")), P("8.1B", granite3("8B '#Parameters 8.1B'")),
        note=_GRANITE_NOTE.format(sha="39975ba909950a1bad8fa1cb6981d4d048b75553", tv="4.46.0")
        + " 3.0-8B-base's shapes with 131,072 positions and rope_theta 1e7. The -instruct checkpoint is not listed: "
          "its config was not available offline. " + GRANITE_BASE_VOCAB),
    row("ibm-granite/granite-3.2-8b-instruct", "granite-3.2", "8b", "instruct",
        (GITHUB, _GRANITE_SRC.format(name="granite-3.2-8b-instruct")),
        P("8B", "IBM Granite-3.2-8B-Instruct model card (as Replicate's official ibm-granite/granite-3.2-8b-instruct "
                "page copies it): 'Granite-3.2-8B-Instruct is a 8-billion parameter 128K context length language "
                "model fine-tuned for reasoning and instruction-following capabilities'"),
        note=_GRANITE_NOTE.format(sha="610d8c6ee9c84ce51f6dfd7bc5c0215d95d49695", tv="4.47.0")
        + " granite-3.1-8b-base's file but vocabulary 49,155; the planner's count, 8,170,848,256, equals the "
          "safetensors total of granite-3.0-8b-instruct (same shapes). The 2B size is not listed: its config was "
          "not available offline."),
    row("ibm-granite/granite-3.0-8b-instruct", "granite-3.0", "8b", "instruct",
        (GITHUB, "Meng0329/skills4s@93891ee28e95647f9a97f04360663ae8491406fd:models/granite-3.0-8b-instruct/config.json"),
        P("8,170,848,256", "the same folder's model.safetensors.index.json: total_size 16,341,696,512 bytes of bf16 "
                           "tensors (no lm_head.weight: tied)"),
        P("8.1B", granite3("8B '#Parameters 8.1B'")),
        note="skills4s' copy of the Hub repository (config.json with the model card and weight index; transformers "
             "4.46.0.dev0). Its attention_dropout is 0.1: dropout is active in training (CUDA's SDPA kernels apply "
             "it in the kernel). The -base checkpoint (vocabulary 49,152) is an entry of its own; the 2B "
             "-instruct is not listed: its config was not available offline."),
    row("ibm-granite/granite-3.0-1b-a400m-instruct", "granite-3.0-moe", "1b-a400m", "instruct",
        (GITHUB, f"{_NANO}@1c27d8306a329a7520cf214a60e129beb8bb1d82:models/granite-3.0-1b-a400m-instruct/config.json"),
        P("1.3B", GRANITE3), P("400M", GRANITE3, counts="active"),
        note=_GRANITE_MOE_NOTE.format(card="Granite-3.0-1B-A400M-Instruct", tv="4.46.0.dev0") + " " + GRANITE3_ACTIVE),
    row("ibm-granite/granite-3.1-1b-a400m-instruct", "granite-3.1-moe", "1b-a400m", "instruct",
        (GITHUB, f"{_NANO}@c16de35338caf09b95babaf32b082f44aaad1883:models/granite-3.1-1b-a400m-instruct/config.json"),
        P("1.3B", GRANITE3), P("400M", GRANITE3, counts="active"),
        note=_GRANITE_MOE_NOTE.format(card="Granite-3.1-1B-A400M-Instruct", tv="4.47.0") + " " + GRANITE3_ACTIVE
        + " 3.1 raises the context to 131,072 positions (rope_theta 1.5e6); the shapes are 3.0's."),
    row("ibm-granite/granite-3.0-3b-a800m-base", "granite-3.0-moe", "3b-a800m", "base",
        (GITHUB, _GRANITEMOE_SRC.format(name="granite-3.0-3b-a800m-base")),
        P("3.3B", granite3("3B-A800M '#Parameters 3.3B', '#Active Parameters 800M'")),
        P("800M", granite3("3B-A800M '#Parameters 3.3B', '#Active Parameters 800M'"), counts="active"),
        note=_GRANITEMOE_NOTE.format(tv="4.45.0.dev0") + " " + GRANITE3_3B_ACTIVE
        + " The -instruct checkpoint is not listed: its config was not available offline. " + GRANITE_BASE_VOCAB),
    row("ibm-granite/granite-3.1-3b-a800m-base", "granite-3.1-moe", "3b-a800m", "base",
        (GITHUB, _GRANITEMOE_SRC.format(name="granite-3.1-3b-a800m-base")),
        P("3.3B", granite3("3B-A800M '#Parameters 3.3B', '#Active Parameters 800M'")),
        P("800M", granite3("3B-A800M '#Parameters 3.3B', '#Active Parameters 800M'"), counts="active"),
        note=_GRANITEMOE_NOTE.format(tv="4.46.0") + " " + GRANITE3_3B_ACTIVE
        + " 3.0's shapes with 131,072 positions, rope_theta 1e7 and attention_dropout 0.1. The -instruct checkpoint "
          "is not listed: its config was not available offline. " + GRANITE_BASE_VOCAB),
    row("ibm-granite/granite-3.3-8b-instruct", "granite-3.3", "8b", "instruct",
        (GITHUB, "vllm-project/vllm-spyre@f6a83ce12faf6e99e51c8380fba6a90359825e09:tests/fixtures/model_configs/"
                 "ibm-granite/granite-3.3-8b-instruct/config.json"),
        P("8B", "IBM Granite-3.3-8B-Instruct, 'an 8-billion-parameter, decoder-only Transformer model' (as summarised at "
                "emergentmind.com/topics/ibm-granite-3-3-8b-instruct-model; the 3.x 8B instruct cards: 'a 8-billion "
                "parameter 128K context length language model')"),
        note="vllm-spyre's test fixture copy of the Hub config.json (transformers 4.53.3); hlky/dinoml_v2's copy "
             "(the granite-3.2-8b-instruct entry's folder) equals it key for key but transformers_version (4.49.0). "
             "The -base checkpoint and the 2B size are not listed: their configs were not available offline."),
]

# DeepSeek LLM, DeepSeek-Coder (and v1.5), DeepSeekMath, Qwen1.5 and CodeQwen1.5: the Hub files as pytorchKQI keeps them
# (``_KQI_LLMS``). All are LlamaForCausalLM or Qwen2ForCausalLM (transformers builds them natively); each -instruct /
# -chat / -rl checkpoint is its own file (its eos token differs), with its base's shapes.
DEEPSEEK_CODER = ("DeepSeek Coder project page (deepseekcoder.github.io): 'Various model sizes (1.3B, 5.7B, 6.7B and 33B) "
                  "to support different requirements'; the paper (arXiv 2401.14196), abstract: 'a range of open-source "
                  "code models with sizes from 1.3B to 33B'")
DEEPSEEK_LLM = ("DeepSeek LLM: Scaling Open-Source Language Models with Longtermism (arXiv 2401.02954), abstract: 'two "
                "commonly used open-source configurations, 7B and 67B'")
DEEPSEEK_MATH = ("DeepSeek-Math README (deepseek-ai/DeepSeek-Math): 'DeepSeekMath is initialized with DeepSeek-Coder-v1.5 "
                 "7B and continues pre-training on math-related tokens ... DeepSeekMath 7B has achieved an impressive "
                 "score of 51.7% on the competition-level MATH benchmark'; 'we release checkpoints of base, instruct, "
                 "and RL models'")
QWEN15 = ("Qwen blog 'Introducing Qwen1.5' (qwenlm.github.io/blog/qwen1.5, Feb 2024, its list as updated for the later "
          "32B and 110B releases): 'we are open-sourcing base and chat models across six sizes: 0.5B, 1.8B, 4B, 7B, "
          "14B, 32B, 72B, and 110B'")
QWEN15_MOE_BLOG = ("Qwen blog 'Qwen1.5-MoE: Matching 7B Model Performance with 1/3 Activated Parameters' "
                   "(qwenlm.github.io/blog/qwen-moe): 'Compared to Qwen1.5-7B, which contains 6.5 billion "
                   "non-embedding parameters'")
QWEN15_MOE_CARD = ("Qwen1.5-MoE-A2.7B-Chat model card (Hub; as Ollama's zutto/qwen1.5-moe-a2.7b-chat page copies it): "
                   "'It has 14.3B parameters in total and 2.7B activated parameters during runtime'")
CODEQWEN15 = ("Qwen team's CodeQwen1.5 announcement, Chinese edition (developer.aliyun.com/article/1484838): "
              "'CodeQwen1.5 基于 Qwen 语言模型初始化,拥有 7B 参数的模型' (initialised from the Qwen language model, a model "
              "of 7B parameters)")
_DSC_NOTE = ("{kqi} (transformers {tv}). Vocabulary 32,256 and 16,384 positions (linear RoPE scaling, factor 4, over "
             "rope_theta 100,000). {sibling}")
_DS7_NOTE = ("{kqi} (transformers {tv}). DeepSeek LLM 7B's shapes (30 layers, hidden 4,096, vocabulary 102,400, 4,096 "
             "positions). {more}")
_QWEN15_NOTE = "{kqi} (transformers {tv}). {more}"


def _kqi(org_name: str) -> tuple[str, str]:
    return (GITHUB, f"{_KQI_LLMS}/{org_name}/config.json")


ROWS += [
    # DeepSeek-Coder (1.3B / 6.7B / 33B) and DeepSeek-Coder-v1.5 7B (continued from DeepSeek LLM 7B: another line)
    *(row(f"deepseek-ai/deepseek-coder-{size}-{kind}", "deepseek-coder", size, "coder",
          _kqi(f"deepseek-ai/deepseek-coder-{size}-{kind}"), P(size.upper(), DEEPSEEK_CODER),
          note=_DSC_NOTE.format(kqi=_KQI_LLMS_NOTE, tv=tv, sibling=(
              "The -instruct checkpoint (eos 32021) is an entry of its own with these shapes." if kind == "base" else
              f"The deepseek-coder-{size}-base file's shapes; eos 32021 (<|EOT|>)."
              + (" Its _name_or_path is a DeepSeek-internal path, as on the Hub." if size == "6.7b" else ""))))
      for size, kind, tv in (("1.3b", "base", "4.34.1"), ("1.3b", "instruct", "4.33.1"),
                             ("6.7b", "base", "4.34.1"), ("6.7b", "instruct", "4.34.1"),
                             ("33b", "base", "4.34.1"), ("33b", "instruct", "4.33.1"))),
    row("deepseek-ai/deepseek-coder-7b-base-v1.5", "deepseek-coder-v1.5", "7b", "coder",
        _kqi("deepseek-ai/deepseek-coder-7b-base-v1.5"), P("7B", DEEPSEEK_MATH),
        note=_DS7_NOTE.format(kqi=_KQI_LLMS_NOTE, tv="4.35.2", more=(
            "Not the 6.7B DeepSeek-Coder (vocabulary 32,256, 32 layers): 'deepseek-coder-7b' names neither. The "
            "-instruct-v1.5 checkpoint is an entry of its own with these shapes."))),
    row("deepseek-ai/deepseek-coder-7b-instruct-v1.5", "deepseek-coder-v1.5", "7b", "coder",
        _kqi("deepseek-ai/deepseek-coder-7b-instruct-v1.5"), P("7B", DEEPSEEK_MATH),
        note=_DS7_NOTE.format(kqi=_KQI_LLMS_NOTE, tv="4.35.2", more="The -base-v1.5 file's shapes; eos 100015.")),
    # DeepSeek LLM 7B / 67B
    *(row(f"deepseek-ai/deepseek-llm-{size}-{kind}", "deepseek-llm", size, "base" if kind == "base" else "instruct",
          _kqi(f"deepseek-ai/deepseek-llm-{size}-{kind}"), P(size.upper(), DEEPSEEK_LLM),
          note=f"{_KQI_LLMS_NOTE} (transformers 4.33.1). " + (
              "Token ids bos 1 / eos 2 as the Hub file has them (the -chat file: 100000 / 100001). The -chat "
              "checkpoint is an entry of its own with these shapes." if kind == "base" else
              f"The deepseek-llm-{size}-base file's shapes; bos 100000, eos 100001."))
      for size, kind in (("7b", "base"), ("7b", "chat"), ("67b", "base"), ("67b", "chat"))),
    # DeepSeekMath 7B (continued from DeepSeek-Coder-v1.5 7B)
    row("deepseek-ai/deepseek-math-7b-base", "deepseek-math", "7b", "math", _kqi("deepseek-ai/deepseek-math-7b-base"),
        P("7B", DEEPSEEK_MATH),
        note=_DS7_NOTE.format(kqi=_KQI_LLMS_NOTE, tv="4.33.1", more=(
            "The -instruct and -rl checkpoints are entries of their own with these shapes."))),
    row("deepseek-ai/deepseek-math-7b-instruct", "deepseek-math", "7b", "math",
        _kqi("deepseek-ai/deepseek-math-7b-instruct"), P("7B", DEEPSEEK_MATH),
        note=_DS7_NOTE.format(kqi=_KQI_LLMS_NOTE, tv="4.33.1", more="The -base file, key for key.")),
    row("deepseek-ai/deepseek-math-7b-rl", "deepseek-math", "7b", "math", _kqi("deepseek-ai/deepseek-math-7b-rl"),
        P("7B", DEEPSEEK_MATH),
        note=_DS7_NOTE.format(kqi=_KQI_LLMS_NOTE, tv="4.33.1", more=(
            "The -instruct model after GRPO reinforcement learning: the -base file's shapes, with a stray "
            "moe_intermediate_size key that LlamaConfig does not read."))),
    # Qwen1.5 (Qwen2ForCausalLM; the base and -Chat files differ in eos, 72B also in rms_norm_eps)
    *(row(f"Qwen/Qwen1.5-{size}{suffix}", "qwen1.5", size.lower(), "instruct" if suffix else "base",
          _kqi(f"Qwen/Qwen1.5-{size}{suffix}"), P(size, QWEN15),
          *((P("6.5B", QWEN15_MOE_BLOG, counts="non_embedding"),) if size == "7B" else ()),
          note=_QWEN15_NOTE.format(kqi=_KQI_LLMS_NOTE, tv=file_tv, more=(
              ("The -Chat checkpoint is an entry of its own with these shapes (eos 151645)." if not suffix else
               f"The Qwen1.5-{size} base file's shapes; eos 151645 (<|im_end|>).") + extra)))
      for size, base_tv, chat_tv, extra in (
          ("0.5B", "4.37.0", "4.37.0", " Tied input and output embeddings."),
          ("1.8B", "4.37.0", "4.37.0", ""), ("4B", "4.37.0", "4.37.0", ""), ("7B", "4.37.0", "4.37.0", ""),
          ("14B", "4.37.0", "4.37.0", ""),
          ("32B", "4.37.2", "4.37.2", " Grouped-query attention (8 KV heads), new in this size."),
          ("72B", "4.37.0", "4.37.0", " The base file has rms_norm_eps 1e-5, the -Chat file 1e-6."),
          ("110B", "4.37.0", "4.37.2", " Grouped-query attention (8 KV heads)."))
      for suffix, file_tv in (("", base_tv), ("-Chat", chat_tv))),
    row("Qwen/Qwen1.5-MoE-A2.7B-Chat", "qwen1.5-moe", "a2.7b", "instruct", _kqi("Qwen/Qwen1.5-MoE-A2.7B-Chat"),
        P("14.3B", QWEN15_MOE_CARD), P("2.7B", QWEN15_MOE_CARD, counts="active"),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.39.0.dev0; keys in Qwen's own order, not sorted). The vendored "
             "Qwen1.5-MoE-A2.7B base file's shapes with 32,768 positions (the base: 8,192) and eos 151645."),
    # CodeQwen1.5 7B (Qwen2ForCausalLM, its own 92,416-token vocabulary, 4 KV heads, 65,536 positions)
    row("Qwen/CodeQwen1.5-7B", "codeqwen1.5", "7b", "coder", _kqi("Qwen/CodeQwen1.5-7B"), P("7B", CODEQWEN15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.39.3). The -Chat checkpoint is an entry of its own with these shapes."),
    row("Qwen/CodeQwen1.5-7B-Chat", "codeqwen1.5", "7b", "coder", _kqi("Qwen/CodeQwen1.5-7B-Chat"),
        P("7B", CODEQWEN15),
        note=f"{_KQI_LLMS_NOTE} (transformers 4.39.3; the file has no trailing newline). The CodeQwen1.5-7B base file, "
             "key for key."),
]

# DeepSeek-V2 / V3 (MLA + MoE). The Hub configs are kept as two public repositories copy them; the authors' own
# inference/configs/config_{16B,236B,671B}.json in deepseek-ai/DeepSeek-V3 (@9b4e9788e4a3a731f7567338ed15d3ec549ce03b,
# their ModelArgs names) agree with each copy on every shape key.
_BUD = "BudEcosystem/simulator@f4880392a25783611a749ed6fe87170708879f8f:BudSimulator/model_param_test.py"
DEEPSEEK_V3 = "DeepSeek-V3 README (deepseek-ai/DeepSeek-V3): '671B total parameters with 37B activated for each token'"
DEEPSEEK_V2 = "DeepSeek-V2 README (deepseek-ai/DeepSeek-V2), model table: total and activated parameters"
DEEPSEEK_ACTIVE = ("DeepSeek counts activated parameters without the input embedding ({embed:,} parameters); the "
                   "planner's active count counts it: less it, {value} rounds to the published figure")

ROWS += [
    row(("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base", "deepseek-ai/DeepSeek-V3-0324",
         "deepseek-ai/DeepSeek-R1"), "deepseek-v3", "671b", "instruct", (GITHUB, f"{_BUD}#config_Deepseek_R1"),
        P("671B", DEEPSEEK_V3), P("37B", DEEPSEEK_V3, counts="active"),
        note="BudSimulator's copy of the DeepSeek-R1 Hub config.json (transformers 4.46.3); V3, V3-Base and V3-0324 "
             "share it (same shapes as the authors' config_671B.json). The 14B multi-token-prediction module of the "
             "685B Hub checkpoint is not built by transformers and not counted. The published weights are FP8 "
             "(quantization_config): Aegis plans and trains bf16 weights."),
    row(("deepseek-ai/DeepSeek-V2", "deepseek-ai/DeepSeek-V2-Chat", "deepseek-ai/DeepSeek-V2.5"), "deepseek-v2",
        "236b", "base", (GITHUB, f"{_BUD}#config_v2_5_236_b"),
        P("236B", DEEPSEEK_V2), P("21B", DEEPSEEK_V2, counts="active"),
        note="BudSimulator's copy of the DeepSeek-V2.5 Hub config.json (transformers 4.39.3); DeepSeek-V2 and -V2-Chat "
             "have the same architecture (the authors' config_236B.json agrees on every shape key)."),
    row(("deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite-Chat"), "deepseek-v2", "16b", "base",
        (GITHUB, "mlc-ai/mlc-llm@79d603f085f50500e9509fa01785ffa7ecfaaa93:python/mlc_llm/model/model_preset.py"
                 "#deepseek_v2_lite"),
        P("16B", DEEPSEEK_V2), P("2.4B", DEEPSEEK_V2, counts="active",
                                 disagrees=DEEPSEEK_ACTIVE.format(embed=102400 * 2048, value="2,451,435,008")),
        set={"q_lora_rank": (None, "mlc-llm's copy leaves out the Hub file's null q_lora_rank (transformers would read "
                                   "its 1536 default); the authors' config_16B.json gives q_lora_rank 0: no query "
                                   "compression")},
        note="mlc-llm's MODEL_PRESETS copy of the Hub config.json (transformers 4.33.1), with q_lora_rank null put back."),
]

# Phi-1.5 / Phi-2 (model_type phi: parallel attention + MLP on one LayerNorm, partial RoPE, lm_head bias).
PHI2 = ("Microsoft Research blog 'Phi-2: The surprising power of small language models' (Dec 2023): 'we are "
        "releasing Phi-2, a 2.7 billion-parameter language model'; the microsoft/phi-2 model card: 'Phi-2 is a "
        "Transformer with 2.7 billion parameters'")

PHI15 = ("microsoft/phi-1_5 model card: 'The language model Phi-1.5 is a Transformer with 1.3 billion parameters' "
         "(also arXiv 2309.05463)")
PHI_AUTO_MAP = ("the revision before Microsoft removed its four auto_map lines (pointing at the repository's own "
                "configuration_phi/modeling_phi, which transformers has not needed since 4.36); every other key is the "
                "current file's")

ROWS += [
    row("microsoft/phi-2", "phi-2", "2.7b", "base",
        (GITHUB, "henryhmko/VLM_interpretability@53ca1a97573e0a0133c7c3949a9caa84a44a2449:phi-2/config.json"),
        P("2.7B", PHI2), sole_size=PHI2 + "; one size, a base model",
        note=f"A copy of the Hub config.json (transformers 4.37.0), {PHI_AUTO_MAP}. The same repository's "
             "model.safetensors.index.json gives total_size 5,559,367,680 bytes in fp16: 2,779,683,840 parameters, "
             "the planner's count. resid_pdrop 0.1: a dropout on the attention and MLP outputs in training. Phi-2 has "
             "no instruct checkpoint from Microsoft."),
    row("microsoft/phi-1_5", "phi-1.5", "1.3b", "base",
        (GITHUB, "Xu0615/AI_Doctor@10ca7c97ee51379af9b62dfbdeb80a2908a58a26:pretrained/pretrained/microsoft/phi-1_5/"
                 "config.json"),
        P("1.3B", PHI15, disagrees="Microsoft's 1.3B leaves out the input embedding: 1,418,270,720 less its "
                                   "104,857,600 (51,200 x 2,048) is 1,313,413,120"),
        sole_size=PHI15 + "; one size, a base model",
        note=f"A full snapshot of the Hub repository (README, tokenizer, remote-code files); its config.json is "
             f"{PHI_AUTO_MAP}. Same shapes as Phi-1."),
]

# Hub config.json files rebuilt from a library's values and kept only where the bytes' sha256 equals the Hub file's, as
# dinoml/model-configs-rs records it for the revision named (a revision-pinned inventory of Hub config.json sizes and
# hashes): byte for byte the Hub's file.
_HUB_HASHES = "dinoml/model-configs-rs@23d004779fcb00691b14e563df7b5bbeba7b472b:corpus/report-repositories.json"
_MLC_PRESETS = "mlc-ai/mlc-llm@79d603f085f50500e9509fa01785ffa7ecfaaa93:python/mlc_llm/model/model_preset.py"


def hash_verified(revision: str, size: int, sha256: str, values: str) -> str:
    return (f"The Hub's config.json at revision {revision}: rebuilt from {values} and byte-identical to the Hub file "
            f"({size} bytes, sha256 {sha256}, per {_HUB_HASHES}).")


STABLELM_3B = ("StableLM-3B-4E1T model card (Hub), 'Model Architecture' table: Parameters 2,795,443,200, hidden size "
               "2560, layers 32, heads 32, sequence length 4096")
STABLELM_2 = ("Stable LM 2 1.6B model card (Hub), 'Model Architecture' table: Parameters 1,644,417,024, hidden size "
              "2048, layers 24, heads 32, sequence length 4096")
PHI1 = ("microsoft/phi-1 model card: 'The language model Phi-1 is a Transformer with 1.3 billion parameters, "
        "specialized for basic Python coding'")

ROWS += [
    row("stabilityai/stablelm-3b-4e1t", "stablelm", "3b", "base", (VENDORED, "stabilityai--stablelm-3b-4e1t.json"),
        P("2,795,443,200", STABLELM_3B),
        note=hash_verified("fa4a6a92fca83c3b4223a3c9bf792887090ebfba", 599,
                           "6a8e761cc1117804c0ebc733f880268f71b1b06c9269f4cdb092c6f115526976",
                           f"mlc-llm's preset ({_MLC_PRESETS})")),
    # StableLM Zephyr 3B: no Hub file offline; litgpt's table (StableLM shapes in StableLmConfig keys)
    row("stabilityai/stablelm-zephyr-3b", "stablelm", "3b", "instruct", (LITGPT, "stablelm-zephyr-3b"),
        P("3B", "StableLM Zephyr 3B model card (Hub): 'a 3 billion parameter instruction tuned' model"),
        note="The DPO-tuned chat model of StableLM-3B-4E1T: litgpt gives both every key alike."),
    row("stabilityai/stablelm-2-1_6b", "stablelm-2", "1.6b", "base", (VENDORED, "stabilityai--stablelm-2-1_6b.json"),
        P("1,644,417,024", STABLELM_2,
          disagrees="the card's figure is 98,304 (24 layers x 4,096, two hidden-wide vectors per layer) below what "
                    "transformers' StableLmForCausalLM builds from this file, 1,644,515,328, which the planner "
                    "reproduces (the meta-device check); the card does not say which tensors it leaves out"),
        note=hash_verified("f499ead74c53749bd93cebc6ce8bc0d7bdf1eaef", 608,
                           "e14f378901a37d07b275e5899d2733aeb4363abdb48748bd8b32714f25d9becb",
                           f"mlc-llm's preset ({_MLC_PRESETS}, labelled stablelm-2-zephyr-1_6b there; the -zephyr "
                           "chat model's own file is not checked, so it is not listed as sharing this one)")),
    row("microsoft/phi-1", "phi-1", "1.3b", "base", (VENDORED, "microsoft--phi-1.json"),
        P("1.3B", PHI1, disagrees="Microsoft's 1.3B leaves out the input embedding, as for Phi-1.5 (same shapes): "
                                  "1,418,270,720 less its 104,857,600 (51,200 x 2,048) is 1,313,413,120"),
        sole_size=PHI1 + "; one size",
        note=hash_verified("d4c0adcb065e84e00ca814e35cba3012ea9841ab", 734,
                           "6a6a640160005481d97389210b2134e24d0ef200c5637c70c364162376448f3b",
                           "transformers' PhiConfig layout with the model card's shapes (the file Phi-1.5's repository "
                           "holds, with Phi-1's name and dtype)")),
]

# GPT-NeoX (Pythia, GPT-NeoX-20B): the Hub files of four Pythia sizes and of GPT-NeoX-20B; litgpt's table for the rest.
PYTHIA = ("Pythia model card (Hub, EleutherAI/pythia-*), engineering-details table: 'Non-Embedding Params' per size "
          "(the card: 'exact parameter counts')")
NEOX_20B = "GPT-NeoX-20B model card (Hub), hyperparameter table: n_parameters 20554567680"
PYTHIA_NOTE = ("Trained on the Pile; the '-deduped' model of each size (trained on the Pile deduplicated) is listed as "
               "sharing this config: the card's engineering table says 'Deduped and non-deduped models of a given size "
               "have the same hyperparameters'. use_parallel_residual: attention and the MLP side by side, each on its "
               "own LayerNorm.")
_PYTHIA_HUB = {
    "70m": ("a39f36b100fe8a5377810d56c3f4789b9c53ac42", 567,
            "002050231a9b1ec3ac77aa6b9b3bbdc4d923f4068a7dd33b8da72a9bd6ad9a43", "18,915,328"),
    "160m": ("50f5173d932e8e61f858120bcb800b97af589f46", 569,
             "76eb275107220e450d31258f792a2efcbee109d8b62ae0088260057dec06362f", "85,056,000"),
    "1b": ("f73d7dcc545c8bd326d8559c8ef84ffe92fea6b2", 569,
           "302d6702a29de1039066e41404877fb8c53b7ddc82e88f9aba277f230086cfe0", "805,736,448"),
    "12b": ("bb1e3e710cdf6b524461d543cfb5ba773f0a81b6", 571,
            "0209f3579c4f3fadb715aa63d6e40f4a2dd17ee0369aea7833298582bfc97e3c", "11,327,027,200"),
}
_PYTHIA_LITGPT = {"14m": "", "31m": "", "410m": "302,311,424", "1.4b": "1,208,602,624", "2.8b": "2,517,652,480",
                  "6.9b": "6,444,163,072"}
_PYTHIA_TEMPLATE = ("GPTNeoXConfig with each size's shapes, as the Pythia Hub files write them (transformers "
                    "4.24.0, float16)")

ROWS += [
    row((f"EleutherAI/pythia-{size}", f"EleutherAI/pythia-{size}-deduped"), "pythia", size, "base",
        (VENDORED, f"EleutherAI--pythia-{size}.json"),
        P(figure, PYTHIA, "non_embedding"),
        note=hash_verified(rev, n, sha, _PYTHIA_TEMPLATE) + " " + PYTHIA_NOTE)
    for size, (rev, n, sha, figure) in _PYTHIA_HUB.items()
]
ROWS += [
    row((f"EleutherAI/pythia-{size}", *((f"EleutherAI/pythia-{size}-deduped",) if size not in ("14m", "31m") else ())),
        "pythia", size, "base", (LITGPT, f"pythia-{size}"),
        *([P(figure, PYTHIA, "non_embedding")] if figure else [P(size.upper(), "the Hub id: the size in the name")]),
        arch="gpt_neox", note=PYTHIA_NOTE + " From litgpt's table, whose rows for the four sizes bundled as Hub files "
                                           "(70m, 160m, 1b, 12b) convert to those files' keys and values exactly.")
    for size, figure in _PYTHIA_LITGPT.items()
]
ROWS += [
    row("EleutherAI/gpt-neox-20b", "gpt-neox", "20b", "base", (VENDORED, "EleutherAI--gpt-neox-20b.json"),
        P("20,554,567,680", NEOX_20B),
        note="The Hub's config.json at revision c292233c833e336628618a88a648727eb3dff0a7 (613 bytes, sha256 "
             "0c13687d6cfccbe23d0cc980a31605c180e3e93145bfc0192468f0e37cc418be, per " + _HUB_HASHES + "), copied "
             "from QiushengSong/Mamba_for_Named_Entity_Recoginition@626e582996aad783aa7fa1e063b13e4ff1550812:"
             "EleutherAI/gpt-neox-20b/config.json. hidden_act gelu_fast; parallel attention and MLP (GPTNeoXConfig's "
             "default)."),
]

# StableLM-Alpha and StableCode-Alpha (2023): GPT-NeoX models (model_type gpt_neox), from litgpt's table.
STABLELM_ALPHA = ("StableLM-Alpha model cards (Hub, stabilityai/stablelm-base-alpha-3b and -7b): 'StableLM-Base-Alpha is a "
                  "suite of 3B and 7B parameter decoder-only language models'")
STABLECODE = "StableCode-Completion-Alpha-3B model card (Hub): 'a 3 billion parameter decoder-only code completion model'"
STABLECODE_INSTRUCT = ("StableCode-Instruct-Alpha-3B model card (Hub): 'a 3 billion parameter decoder-only instruction "
                       "tuned code model'")
ALPHA_NOTE = ("GPT-NeoX's layout (parallel attention and MLP, each on its own LayerNorm, a quarter of each head rotated) "
              "from litgpt's table; the -tuned- models are the chat fine-tunes of the base models, with their shapes.")

ROWS += [
    row(f"stabilityai/stablelm-{kind}-alpha-{size}", "stablelm-alpha", size, variant, (LITGPT, f"stablelm-{kind}-alpha-{size}"),
        P(size.upper(), STABLELM_ALPHA), arch="gpt_neox", note=ALPHA_NOTE)
    for kind, variant in (("base", "base"), ("tuned", "instruct")) for size in ("3b", "7b")
] + [
    row("stabilityai/stablecode-completion-alpha-3b", "stablecode", "3b", "base",
        (LITGPT, "stablecode-completion-alpha-3b"), P("3B", STABLECODE), arch="gpt_neox",
        note="GPT-NeoX's layout from litgpt's table: 16,384 positions (the -4k model: 4,096)."),
    row("stabilityai/stablecode-completion-alpha-3b-4k", "stablecode", "3b", "base",
        (LITGPT, "stablecode-completion-alpha-3b-4k"), P("3B", STABLECODE), arch="gpt_neox",
        note="GPT-NeoX's layout from litgpt's table, with 4,096 positions."),
    row("stabilityai/stablecode-instruct-alpha-3b", "stablecode", "3b", "instruct",
        (LITGPT, "stablecode-instruct-alpha-3b"), P("3B", STABLECODE_INSTRUCT), arch="gpt_neox",
        note="GPT-NeoX's layout from litgpt's table (4,096 positions)."),
]

# Falcon (model_type falcon): the Hub files of Falcon-7B and Falcon-40B; litgpt's table for the chat models and 180B.
FALCON_7B = "Falcon-7B model card (Hub): 'Falcon-7B is a 7B parameters causal decoder-only model'"
FALCON_40B = "Falcon-40B model card (Hub): 'Falcon-40B is a 40B parameters causal decoder-only model'"
FALCON_180B = "Falcon-180B model card (Hub): 'Falcon-180B is a 180B parameters causal decoder-only model'"
FALCON_RECON = ("FalconConfig's keys with the model card's shapes, as the Falcon Hub files write them (with the "
                "remote-code auto_map of the original upload)")
FALCON_LITGPT = ("From litgpt's table, whose rows for Falcon-7B and Falcon-40B convert to the bundled Hub files' keys and "
                 "values; litgpt gives this model every key its base model has.")

ROWS += [
    row("tiiuae/falcon-7b", "falcon", "7b", "base", (VENDORED, "tiiuae--falcon-7b.json"), P("7B", FALCON_7B),
        note=hash_verified("ec89142b67d748a1865ea4451372db8313ada0d8", 1048,
                           "ef0b96fb53bf7627eb115138bdfd36edb5661891816546f41ed91fb80f19ab31", FALCON_RECON)
        + " Multi-query attention (one key/value head); attention and the MLP side by side on one LayerNorm; tied "
          "embeddings (FalconConfig's default)."),
    row("tiiuae/falcon-7b-instruct", "falcon", "7b", "instruct", (LITGPT, "falcon-7b-instruct"), P("7B", FALCON_7B),
        arch="falcon", note=FALCON_LITGPT),
    row("tiiuae/falcon-40b", "falcon", "40b", "base", (VENDORED, "tiiuae--falcon-40b.json"), P("40B", FALCON_40B),
        note=hash_verified("05ab2ee8d6b593bdbab17d728de5c028a7a94d83", 1046,
                           "0976177b24951f9b0294cf9c79e5fa907530d6e7da4e1def3b187b0714f0f03b", FALCON_RECON)
        + " new_decoder_architecture: eight key/value heads, attention and the MLP each on its own LayerNorm "
          "(ln_attn, ln_mlp)."),
    row("tiiuae/falcon-40b-instruct", "falcon", "40b", "instruct", (LITGPT, "falcon-40b-instruct"),
        P("40B", FALCON_40B), arch="falcon", note=FALCON_LITGPT),
    row("tiiuae/falcon-180B", "falcon", "180b", "base", (LITGPT, "falcon-180B"), P("180B", FALCON_180B),
        arch="falcon", note="From litgpt's table (Falcon-40B's layout at 14,848 wide, 80 layers, 232 heads)."),
    row("tiiuae/falcon-180B-chat", "falcon", "180b", "instruct", (LITGPT, "falcon-180B-chat"), P("180B", FALCON_180B),
        arch="falcon", note=FALCON_LITGPT.replace("Falcon-7B and Falcon-40B", "Falcon-7B and Falcon-40B (the same "
                                                                              "layout)")),
]

# Fine-tunes of Mistral-7B-v0.1 and Llama-2-7B whose Hub config.json another repository keeps
ROWS += [
    row("HuggingFaceH4/zephyr-7b-beta", "zephyr", "7b", "instruct",
        (GITHUB, "tikun-technologies/MF2-BACKEND@7b267a459fc3e45a603a8a3ff5079cacdf84b47c:models/zephyr-7b-beta/"
                 "config.json"),
        P("7,241,732,096", "model.safetensors.index.json beside that config.json (the same Hub snapshot): total_size "
                           "14,483,464,192 bytes, every tensor bfloat16"),
        note="A Hub snapshot without its weights: config.json (_name_or_path HuggingFaceH4/zephyr-7b-beta, transformers "
             "4.35.0) beside the safetensors index. A DPO fine-tune of Mistral-7B-v0.1 with its shapes."),
    row("lmsys/vicuna-7b-v1.5", "vicuna", "7b", "instruct",
        (GITHUB, "bgorlick/getai@6b7200996b2c6fc3a2d52cbbbf08dc089c2c2939:models/lmsys_vicuna-7b-v1.5/config.json"),
        P("7B", "the Hub id (lmsys/vicuna-7b-v1.5): the size in the name"),
        note="Downloaded from huggingface.co/lmsys/vicuna-7b-v1.5 (branch main, 2024-06-06) by text-generation-webui, "
             "whose huggingface-metadata.txt beside it records the URL and the weights' sha256 (transformers 4.31.0). "
             "Llama-2-7B's shapes with 4,096 positions; v1.1 and v1.3 were fine-tuned from LLaMA 1 (2,048 positions)."),
]


# StarCoder2 (model_type starcoder2): LayerNorms and biases, plain GELU MLP (c_fc/c_proj), one sliding window.
_DINOML_SC2 = "hlky/dinoml_v2@6b8c0acb3a19f77188401b57db6e403aa92534f3:agents/plans/transformers/starcoder2/_sources"
STARCODER2 = ("StarCoder2 paper (arXiv 2402.19173) abstract: 'We train StarCoder2 models with 3B, 7B, and 15B "
              "parameters'")
SC2_NOTE = ("dinoml_v2's snapshot of the Hub config.json (its _sources folder, removed from the repository's later "
            "commits), the size the Hub's file listing gives ({size} bytes, '{commit}')")

ROWS += [
    row("bigcode/starcoder2-3b", "starcoder2", "3b", "base", (GITHUB, f"{_DINOML_SC2}/bigcode__starcoder2-3b.config.json"),
        P("3B", STARCODER2),
        note=SC2_NOTE.format(size=700, commit="add dropout (#6)") + "; AshishKumar4/dew's test fixture (Hub revision "
             "733247c5) has the same keys and values. No tie_word_embeddings key: tied, Starcoder2Config's default. "
             "Attention, residual and embedding dropout 0.1 in training."),
    row("bigcode/starcoder2-7b", "starcoder2", "7b", "base", (GITHUB, f"{_DINOML_SC2}/bigcode__starcoder2-7b.config.json"),
        P("7B", STARCODER2),
        note=SC2_NOTE.format(size=893, commit="add dropout (#7)") + "; it keeps GPT-BigCode keys transformers ignores "
             "(activation_function, scale_attn_weights, ...). Tied embeddings (no key: the default). Dropouts 0.1."),
    row("bigcode/starcoder2-15b", "starcoder2", "15b", "base",
        (GITHUB, f"{_DINOML_SC2}/bigcode__starcoder2-15b.config.json"), P("15B", STARCODER2),
        note=SC2_NOTE.format(size=803, commit="add dropout (#13)") + ". Untied embeddings. Dropouts 0.1."),
    row("bigcode/starcoder2-15b-instruct-v0.1", "starcoder2", "15b", "instruct",
        (GITHUB, f"{_DINOML_SC2}/bigcode__starcoder2-15b-instruct-v0.1.config.json"),
        P("15B", STARCODER2 + "; the instruct model is StarCoder2-15B fine-tuned, the same shapes"),
        note=SC2_NOTE.format(size=800, commit="Upload Starcoder2ForCausalLM") + " (transformers 4.39.0.dev0, "
             "bfloat16). Its dropouts are 0 (the base file's are 0.1)."),
]


# GPT-2 (model_type gpt2): learned positions, Conv1D linears, LayerNorms and biases. The Hub files are rebuilt from
# qizhou000/DAFNet's copy of gpt2-xl's config.json (byte-identical to the Hub's), changing only the widths nanoGPT's
# from_pretrained table gives each size (and the keys the Hub's medium and distil files add), and kept where the
# sha256 equals the Hub file's in dinoml/model-configs-rs's inventory.
_NANOGPT = ("karpathy/nanoGPT@3adf61e154c3fe3fca428ad6bc3818b27a3b8291:model.py, GPT.from_pretrained's config_args: "
            "n_layer, n_head, n_embd of gpt2 / gpt2-medium / gpt2-large / gpt2-xl, vocab 50,257, block 1,024, biases")
GPT2_CARD = "openai-community/{name} model card (Hub): '{words}'"


def _gpt2_source(size: int, sha256: str, revision: str, changed: str) -> str:
    return hash_verified(revision, size, sha256, f"gpt2-xl's Hub config.json as qizhou000/DAFNet@4fb2bf56 keeps it "
                                                 f"(models/gpt2-xl/config.json) with {changed} ({_NANOGPT})")


ROWS += [
    row("openai-community/gpt2", "gpt-2", "124m", "base", (VENDORED, "openai-community--gpt2.json"),
        P("124M", GPT2_CARD.format(name="gpt2", words="the smallest version of GPT-2, with 124M parameters")),
        note=_gpt2_source(665, "0daed7749b4f02b8f76240d5444551d7b08712dab4d0adb8239c56ba823bb7b4",
                          "607a30d783dfa663caf39e06633721c8d4cfcd7e",
                          "n_embd 768, n_head 12, n_layer 12 and without output_past") +
        " 1,024 learned positions: a hard limit on the sequence. Dropouts 0.1 in training."),
    row("openai-community/gpt2-medium", "gpt-2", "355m", "base",
        (VENDORED, "openai-community--gpt2-medium.json"),
        P("355M", GPT2_CARD.format(name="gpt2-medium", words="GPT-2 Medium is the 355M parameter version of GPT-2")),
        note=_gpt2_source(718, "ef1a44d889ad1a0acc7731c78134f1b87d2d222f110e97dd10fd4117331caf22",
                          "6dcaa7a952f72f9298047fd5137cd6e4f05f41da",
                          "n_embd 1,024, n_head 16, n_layer 24, n_special 0 and predict_special_tokens (keys "
                          "transformers ignores), without output_past") + " 1,024 learned positions."),
    row("openai-community/gpt2-large", "gpt-2", "774m", "base",
        (VENDORED, "openai-community--gpt2-large.json"),
        P("774M", GPT2_CARD.format(name="gpt2-large", words="GPT-2 Large is the 774M parameter version of GPT-2")),
        note=_gpt2_source(666, "7fccdcfd6622055342a734c663ee0b61ff4fd697f42467595df0bf4448c8c170",
                          "32b71b12589c2f8d625668d2335a01cac3249519",
                          "n_embd 1,280, n_head 20, n_layer 36, without output_past (xu737/PeFAD@a9bdaa1c keeps the "
                          "same file, gpt2-l/config.json, with a trailing newline)") + " 1,024 learned positions."),
    row("openai-community/gpt2-xl", "gpt-2", "1.5b", "base", (VENDORED, "openai-community--gpt2-xl.json"),
        P("1.5B", GPT2_CARD.format(name="gpt2-xl", words="GPT-2 XL is the 1.5B parameter version of GPT-2")),
        P("1558M", _NANOGPT + ": its comment '# 1558M params'"),
        note=_gpt2_source(689, "be48115d52314bc27327e160bf10197760db02ea689d10adb24db4102edf7a8a",
                          "15ea56dee5df4983c59b2538573817e1667135e2", "nothing changed") +
        " 1,024 learned positions."),
    row("distilbert/distilgpt2", "distilgpt2", "82m", "base",
        (VENDORED, "distilbert--distilgpt2.json"),
        P("82M", "distilbert/distilgpt2 model card (Hub): 'DistilGPT2 ... has 82 million parameters'"),
        sole_size="distilbert/distilgpt2 model card: one model, distilled from the 124M GPT-2",
        note=_gpt2_source(762, "4ec5947c1d59fee6212cdf3b0ec1a53eac02092554c5ff0a733488cbd2c64f3a",
                          "2290a62682d06624634c1f46a6ad5be0f47f38aa",
                          "n_embd 768, n_head 12, n_layer 6, _num_labels, id2label and label2id (keys transformers "
                          "ignores for a causal LM), without output_past") +
        " GPT-2 (124M)'s widths in 6 layers; 1,024 learned positions."),
]


# OPT (model_type opt): learned positions offset by 2, LayerNorms and biases, ReLU MLP. The Hub files are rebuilt from
# OPT-125m's config.json as public copies quote it key by key (transformers 4.21.0.dev0, float16), with each size's
# widths from the OPT paper's Table 1, and kept where the sha256 equals the Hub file's in
# dinoml/model-configs-rs's inventory. OPT-350m (post-LayerNorm, project_in/out) is refused by the registry.
OPT_PAPER = ("OPT paper (Zhang et al., arXiv 2205.01068), Table 1: 125M, 350M, 1.3B, 2.7B, 6.7B, 13B, 30B, 66B, 175B "
             "parameters, with each size's layers, heads and width")


def _opt_source(size: int, sha256: str, revision: str, changed: str) -> str:
    return hash_verified(revision, size, sha256, f"OPT-125m's config.json as public copies quote it {changed}")


ROWS += [
    row("facebook/opt-125m", "opt", "125m", "base", (VENDORED, "facebook--opt-125m.json"), P("125M", OPT_PAPER),
        note=_opt_source(651, "54162c9cd0377110df1859dfabebb106fc0988c8aadb88207ce1ee0d34985df6",
                         "27dcfa74d334bc871f3234de431e71c6eeba5dd6", "(as it is)") +
        " 2,048 learned positions (2,050 rows: OPT's offset of 2), a hard limit on the sequence; dropout 0.1 on both "
        "sublayer outputs in training."),
    row("facebook/opt-1.3b", "opt", "1.3b", "base", (VENDORED, "facebook--opt-1.3b.json"), P("1.3B", OPT_PAPER),
        note=_opt_source(653, "f1aaceefb7d34d346e9b0400d95fdb4970567bcbe1d4aba1068c5402099b644f",
                         "3f5c25d0bc631cb57ac65913f76e22c2dfb61d62",
                         "with hidden_size and word_embed_proj_dim 2,048, 32 heads, 24 layers, ffn_dim 8,192") +
        " 2,048 learned positions."),
    row("facebook/opt-6.7b", "opt", "6.7b", "base", (VENDORED, "facebook--opt-6.7b.json"), P("6.7B", OPT_PAPER),
        note=_opt_source(651, "05bcf525449fe484fd741ec49620e96e74992c13e46d83327165645a38666ce6",
                         "a45aa65bbeb77c1558bc99bedc6779195462dab0",
                         "with hidden_size and word_embed_proj_dim 4,096, 32 heads, 32 layers, ffn_dim 16,384, "
                         "_remove_final_layer_norm false and no _name_or_path") + " 2,048 learned positions."),
    row("facebook/opt-30b", "opt", "30b", "base", (VENDORED, "facebook--opt-30b.json"), P("30B", OPT_PAPER),
        note=_opt_source(651, "b8a260a845f4cc70560757da2c7afc1b8cb6a2823d28331a78b0ac780f969be8",
                         "ceea0a90ac0f6fae7c2c34bcb40477438c152546",
                         "with hidden_size and word_embed_proj_dim 7,168, 56 heads, 48 layers, ffn_dim 28,672, "
                         "_remove_final_layer_norm false and no _name_or_path") + " 2,048 learned positions."),
]


# GPT-BigCode (model_type gpt_bigcode): GPT-2's layout in nn.Linear with multi-query attention.
SANTACODER = ("SantaCoder paper (Allal et al., arXiv 2301.03988), abstract: 'We train 1.1B parameter models on the "
              "Java, JavaScript, and Python subsets of The Stack'")

ROWS += [
    row("bigcode/gpt_bigcode-santacoder", "santacoder", "1.1b", "base", (GITHUB, f"{_MLC}#gpt_bigcode"),
        P("1.1B", SANTACODER), sole_size=SANTACODER + "; one released size",
        note="mlc-llm's MODEL_PRESETS 'gpt_bigcode' entry (transformers 4.28.0.dev0): SantaCoder's shapes in "
             "GPTBigCodeConfig keys (24 layers, 2,048 wide, 16 query heads and one key/value head, 2,048 learned "
             "positions, vocabulary 49,280), the transformers-native bigcode/gpt_bigcode-santacoder. Dropouts 0.1 "
             "in training."),
]

AYA_23 = ("Aya 23 model card (CohereForAI/aya-23-8B): 'Aya 23 is an open weights research release of an instruction "
          "fine-tuned model' ... 'This model card corresponds to the 8-billion version'; Aya 23 paper (Aryabumi et "
          "al., arXiv 2405.15032): 8B and 35B")

ROWS += [
    row(("CohereForAI/aya-23-8B", "CohereLabs/aya-23-8B"), "aya-23", "8b", "instruct", (GITHUB, f"{_MLC}#aya-23"),
        P("8B", AYA_23),
        note="mlc-llm's MODEL_PRESETS 'aya-23' entry (transformers 4.40.0.dev0): Aya 23 8B's shapes in CohereConfig "
             "keys (32 layers, 4,096 wide, 32 query and 8 key/value heads, 14,336-wide SwiGLU, vocabulary 256,000, "
             "logit_scale 0.0625, rope_theta 10,000), the head tied to the embedding (CohereConfig's default). "
             "CohereLabs/aya-23-8B is the same repository after Cohere For AI's rename."),
]
