"""The words of a free-text plan request: regular-expression atoms and the vocabulary tables
(methods, optimizers, precisions, checkpointing, the stack, LoRA targets, numeric settings and their ranges)
that `aegis.planning.parse` scans a request with. Data and pattern helpers only; the reading is in `aegis.planning.parse`."""

from __future__ import annotations

import re

_B = r"(?<![a-z0-9])"
_E = r"(?![a-z0-9])"
_S = r"[\s_-]*"
_SEP = r"[\s_-]*?(?:(?:=|:|of|to|is|at)[\s_-]*?)?"  # lazy: a '-' before digits after a space is a sign
_SIGN = r"(?:(?<![^\s=:(\[])[-+\u2212])?"
"""A minus (or plus) sign kept with its number when it follows a space, '=', ':' or a bracket ('bs -2', 'bs=-2');
glued to a word it is a separator ('rank-16')."""
_NUMBER = _SIGN + r"\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?"
"""A number as typed, sign, thousands commas, decimals and exponent included: read whole and validated (never
read in part: 'seq 1000000000' is one out-of-range length, not a length of 100000000 and a stray 0)."""
_UNIT = r"(?:%|[a-wyz][a-z]*|x[a-z]+)?"
"""Letters glued to a number ('4kb', '2k'), read with it and judged by the setting; a bare 'x' is a count ('8x')."""
_INT = r"(" + _NUMBER + _UNIT + r")(?![\d.])"
_NUM = _INT
_WORDS = {
    "one": 1, "single": 1, "two": 2, "dual": 2, "pair": 2, "three": 3, "four": 4, "quad": 4, "five": 5,
    "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "twelve": 12, "sixteen": 16,
}
_COUNT = r"(" + _SIGN + r"\d+(?:\.\d+)?(?![\d.])|" + "|".join(_WORDS) + ")"
"""A GPU count as typed (sign and fraction kept, so '-2x' and '1.5x' are refused rather than read as 2 and 5)."""


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.ASCII)


def _word(pattern: str) -> re.Pattern[str]:
    """A pattern matched as whole words. Shorthands: '~' optional separators, '@' a separator such as
    ' = ' or ' of ', '#' an integer (a group)."""
    for short, full in (("~", _S), ("@", _SEP), ("#", _INT)):
        pattern = pattern.replace(short, full)
    return _rx(_B + "(?:" + pattern + ")" + _E)


_METHODS: list[tuple[str, re.Pattern[str]]] = [
    # "lora" naming one of its settings ("lora dropout 0.1", "lora rank 32"): LoRA only when the message names a
    # model too (a whole request); alone it is a follow-up about a setting, not a switch from QLoRA (see _settle)
    ("lora?", _word(r"lora(?=~(?:dropout|alpha|rank|r|dim|targets?|target~modules)(?![a-z]))")),
    ("qlora", _word(r"q~lora|(?:4|four)~bits?(?:~(?:quanti[sz]ed|nf4))?~lora|nf4~lora"
                    r"|lora~(?:on|with|over)~(?:an?~)?(?:4~bits?|nf4)(?:~(?:base|model|quanti[sz]ation|weights))?")),
    ("lora", _word(r"lora|peft|low~rank~(?:adaptation|adapters?)")),
    ("full", _word(r"full(?!~precision)(?:~(?:param(?:eter)?s?|weights?|model))?"
                   r"(?:~(?:fine~tun(?:e|ed|ing)|finetun(?:e|ed|ing)|ft|sft|train(?:ing)?|tun(?:e|ing)))?"
                   r"|fft|all~(?:param(?:eter)?s|weights)")),
]

_OPTIMIZERS: list[tuple[str, re.Pattern[str]]] = [
    ("paged_adamw_8bit", _word(r"paged~(?:8~bits?~)?adamw?(?:~8~bits?)?(?!~32)")),
    ("adamw", _word(r"paged~adamw?~32~bits?")),  # paged 32-bit AdamW holds AdamW's state
    ("adamw_8bit", _word(r"(?:8|eight)~bits?~adamw?|adamw?~(?:bnb~)?8~bits?|bnb~adamw?(?:~8~bits?)?")),
    ("adafactor", _word(r"adafactor")),
    ("sgd", _word(r"sgd(?:~(?:with~)?momentum)?")),
    ("adamw", _word(r"adamw?(?:~(?:torch(?:~fused)?|fused|hf|32~bits?))?")),
]

_PRECISIONS: list[tuple[str, re.Pattern[str]]] = [
    ("fp16_mixed", _word(r"(?:fp16|float16|half~precision)(?:~(?:mixed|amp)(?:~precision)?)?"
                         r"|(?:mixed|amp)~(?:precision~)?(?:fp16|float16)")),
    ("bf16_mixed", _word(r"(?:bf16|bfloat16)~(?:mixed|amp|autocast)(?:~precision)?|(?:mixed|amp)~(?:precision~)?(?:bf16|bfloat16)")),
    ("bf16_mixed?", _word(r"mixed~precision")),  # settled with the other precisions said (see _settle)
    ("bf16", _word(r"(?:pure~)?(?:bf16|bfloat16)")),
    ("fp32", _word(r"fp32|float32|full~precision|single~precision")),
]

_CKPT = r"(?:(?:grad(?:ient)?|activation)~(?:ckpt|checkpointing|checkpoints?)|checkpointing)"
_CHECKPOINTING: list[tuple[bool, re.Pattern[str]]] = [
    (False, _word(r"(?:no|not|without|disabled?|w/o|off)~(?:the~)?(?:" + _CKPT + r"|ckpt|gc)")),
    (False, _word(r"(?:" + _CKPT + r"|ckpt|gc)(?:~(?:=|:)~(?:off|false|no|0|disabled?|none)|~(?:off|false|disabled))")),
    (True, _word(r"(?:(?:with|use|using|enable|enabled)~)?(?:" + _CKPT + r"|gc~ckpt)"
                 r"(?:~(?:=|:)~(?:on|true|yes|1|enabled?)|~(?:on|true|enabled)(?!~(?:an?|the|\d)(?![a-z0-9])))?")),
]

_TARGETS: list[tuple[tuple[str, ...], re.Pattern[str]]] = [
    (("all-linear",), _word(r"(?:lora~)?(?:on~)?all~linear(?:~(?:layers?|modules?|projections?))?"
                            r"|(?:lora~)?target(?:~modules|s)?@all~linear")),
    (("q_proj", "k_proj", "v_proj", "o_proj"),
     _word(r"(?:lora~)?(?:on~)?(?:the~)?attention(?:~(?:layers?|modules?|projections?))?~only|attn~only")),
]
"""LoRA targets said in words: PEFT's all-linear, or the attention projections alone (else the default)."""

_CKPT_MODES: list[tuple[str, re.Pattern[str]]] = [
    ("non_reentrant", _word(r"non~reentrant(?:~(?:" + _CKPT + r"|ckpt|gc))?")),
    ("reentrant", _word(r"reentrant(?:~(?:" + _CKPT + r"|ckpt|gc))?")),
    ("offload", _word(r"(?:(?:cpu~)?offload(?:ed|ing)?|unsloth)~(?:" + _CKPT + r"|ckpt|gc)")),
]
"""Which gradient checkpointing (torch's reentrant or not, Unsloth's CPU-offloaded); saying one turns it on."""

_TRAINERS: list[tuple[str, re.Pattern[str]]] = [
    ("peft", _word(r"(?:plain|bare|raw|custom|own|manual|vanilla|simple)~(?:peft~)?(?:py~?torch~|torch~)?(?:training~)?loop"
                   r"|peft~(?:only|alone|loop)|(?:plain|bare|vanilla|raw)~peft")),
    ("trl", _word(r"trl(?:~sft)?(?:~?trainer)?|sft~?trainer")),
    ("axolotl", _word(r"axolotl")),
    ("unsloth", _word(r"unsloth")),
    ("hf", _word(r"(?:hf|hugging~face|transformers)~trainer|trainer~api")),
]
"""The trainer that runs the step, said in words (``--trainer``); a bare "peft" still means LoRA."""

_KBIT = r"(?:k~?bit~prep(?:aration|are)?|prepare~model~for~k~?bit~training)"
_KBIT_PREP: list[tuple[bool, re.Pattern[str]]] = [
    (False, _word(r"(?:no|not|without|w/o|skip(?:ping|s)?|disabled?)~(?:the~)?" + _KBIT)),
    (True, _word(r"(?:with~|using~)?" + _KBIT)),
]
_LIGER: list[tuple[bool, re.Pattern[str]]] = [
    (False, _word(r"(?:no|not|without|w/o)~liger(?:~kernels?)?")),
    (True, _word(r"liger(?:~kernels?)?")),
]
_TRANSFORMERS_VERSION = _word(r"(?:hf~)?transformers?~(?:(?:==|>=|=|:|version)~)?v?(\d{1,2}(?:\.\d{1,3}){0,2})(?:\.x)?")
"""``transformers 4.48`` / ``transformers v4``: the version the run uses (``--transformers``)."""

_SHARDING: list[tuple[str, re.Pattern[str]]] = [
    ("fsdp", _word(r"fsdp2?|fully~sharded(?:~data~parallel(?:ism)?)?|full~shard|fully~shard")),
    ("ddp", _word(r"ddp|distributed~data~parallel(?:ism)?")),
]
"""How the GPUs share the model: FSDP (FULL_SHARD) or DDP, when the request says so."""

_VALUE = r"\d{1,9}(?:\.\d{1,9})?(?:e[+-]?\d{1,3})?%?"
_IGNORED = _word(
    r"(?:lr|learning~rate)@" + _VALUE + r"|warm~?up(?:~(?:steps|ratio))?@" + _VALUE + r"(?:~steps)?|" + _VALUE + r"~warm~?up"
    r"|(?:max~)?steps@#|#~(?:training~)?steps|(?:save|eval(?:uate)?|log(?:ging)?)~every~#(?:~steps)?"
    r"|(?:per~device~)?eval~batch(?:~size)?@#|(?:lora~)?alpha@" + _VALUE
    + r"|(?:weight~decay|wd)@" + _VALUE + r"|seed@#"
)
"""Training settings the planner does not use: consumed (and noted) so their numbers are not read as batch or GPU."""

_SEQ_VALUE = r"(" + _NUMBER + r"(?:~k(?![a-z]))?" + _UNIT + r")(?![\d.])"
_SETTINGS: list[tuple[str, re.Pattern[str]]] = [
    ("effective_batch_size", _word(r"(?:(?:effective|global|total|eff)~(?:batch(?:~size)?|bs)|gbs|ebs)@#")),
    ("effective_batch_size", _word(r"#~(?:effective|global)~batch(?:~size)?")),
    ("grad_accum", _word(r"(?:grad(?:ient)?~acc(?:um(?:ulation)?)?(?:~steps)?|gas)@#")),
    ("grad_accum", _word(r"#~(?:grad(?:ient)?~)?acc(?:um(?:ulation)?)?(?:~steps)?")),
    ("micro_batch_size", _word(r"(?:micro~batch(?:~size)?|mbs|per~(?:device|gpu)~(?:train~)?batch(?:~size)?"
                               r"|(?:train~)?batch~size|bs|batch)@#")),
    ("lora_rank", _word(r"(?:(?:lora~)?rank|lora~(?:r|dim))@#")),
    ("lora_rank", _word(r"(?<![a-z0-9]-)r@#")),  # r=32, r32; not deepseek-r1
    ("lora_rank", _word(r"#~rank")),
    ("seq_len", _word(r"(?:(?:max(?:imum)?~)?(?:seq(?:uence)?(?:~len(?:gth)?)?|length|tokens)|ctx(?:~len)?"
                      r"|context(?:~(?:len(?:gth)?|window|size))?|cutoff~len|block~size|model~max~length)@" + _SEQ_VALUE)),
    ("seq_len", _word(_SEQ_VALUE + r"~(?:tokens?|tok|ctx|context(?:~(?:len(?:gth)?|window))?|seq(?:uence)?~len(?:gth)?|seq)")),
    ("epochs", _word(r"(?:num~(?:train~)?)?epochs?@" + _NUM)),  # before '3 epochs': 'on 3090 epochs 2' is 2
    ("epochs", _word(r"(" + _NUMBER + r"(?![\d.])|" + "|".join(_WORDS) + r")~(?:epochs?|eps?)")),
    ("lora_dropout", _word(r"(?:lora~)?dropout@" + _NUM)),
]

_BOUNDS: dict[str, tuple[float, float, str]] = {
    "micro_batch_size": (1, 65536, "micro batch size"),
    "effective_batch_size": (1, 2**24, "effective batch size"),
    "grad_accum": (1, 65536, "gradient accumulation steps"),
    "lora_rank": (1, 4096, "LoRA rank"),
    "seq_len": (1, 2**24, "sequence length"),
    "epochs": (1e-6, 10000, "epochs"),
    "lora_dropout": (0, 0.99, "LoRA dropout"),
    "gpu_count": (1, 4096, "GPU count"),
}
"""Sanity ranges: a value outside is a typo, reported as an issue (rank 4096 is LoRAConfig's own limit). The same
ranges bound the CLI's flags and the planner's fields (`aegis.planning.planner`): one range per setting, however it is said."""

_INTEGER_SETTINGS = frozenset({"micro_batch_size", "effective_batch_size", "grad_accum", "lora_rank", "seq_len",
                               "gpu_count"})
"""Settings that are counts: 2.5 is refused, not rounded."""
