"""``aegis generate MODEL PROMPT``: sample from what Aegis makes or reads, streaming tokens.

MODEL is an HF folder the engine serves, a run's export (a PEFT adapter folder: its base is read from
``adapter_config.json``), a packed BitNet b1.58 folder (``aegis compress``), a Quiet-STaR folder (phase 3: thoughts
before each token, shown with ``show_thoughts``), or a folder with its own modeling code (``auto_map``: a Cognate
export, run by transformers with ``trust_remote_code``; halting steps are shown when the model reports them).
The prompt is rendered with the tokenizer's chat template when it has one.

    from aegis.forge.generate import generate
    text = generate("out/final", "1 0 1 1 0 0 1 0 =", max_new_tokens=8, temperature=0, on_text=print)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from aegis.errors import InvalidConfigError

__all__ = ["generate"]


def _prompt_ids(tok: Any, prompt: str) -> list[int]:
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    return bos + tok.encode(prompt, add_special_tokens=False)


def _engine(folder: Path) -> tuple[Any, Any, str]:
    """(model, params, kind) for the engine: packed, adapter export, or plain folder."""
    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    if (folder / "bitnet_config.json").is_file():
        from aegis.forge.bitnet import load_packed

        pm = load_packed(folder)  # served as trained and as PackedModel.apply runs it (W1.58 A8 by default)
        return pm.model, pm.served_params(), "packed ternary"
    if (folder / "adapter_config.json").is_file():
        from aegis.train.lora import merge_lora
        from aegis.train.weights import load_lora_adapter

        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base or not (Path(base) / "config.json").is_file():
            raise InvalidConfigError(f"{folder} is an adapter whose base {base!r} is not a local model folder")
        model = build_model(json.loads((Path(base) / "config.json").read_text()))
        params = load_checkpoint(model, base)
        return model, merge_lora(params, load_lora_adapter(model, folder)), f"adapter on {base}"
    config = json.loads((folder / "config.json").read_text())
    from aegis.forge.cognate.engine import build_cognate, is_cognate

    if is_cognate(config):  # a Quiet-STaR Cognate model (phase 3): its thoughts run in the engine
        model = build_cognate(config)
        return model, model.load(folder), "engine (Cognate)"
    model = build_model(config)
    return model, load_checkpoint(model, folder), "engine"


def generate(model: str | Path, prompt: str, *, max_new_tokens: int = 64, temperature: float = 0.7, seed: int = 0,
             show_thoughts: bool = False, on_text: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Sample up to ``max_new_tokens`` after ``prompt``; ``on_text`` receives each new piece of text as it comes.
    Returns ``{"text", "tokens", "kind", "thoughts", "halting_steps"}``."""
    folder = Path(model)
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise InvalidConfigError(f"{folder} is not a model folder (no config.json): pass an HF folder, an export, "
                                 "a Quiet-STaR or a compressed model folder")
    from transformers import AutoTokenizer

    tok_dir = folder
    if (folder / "adapter_config.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        tok_dir = Path(json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"])
    from aegis.forge._quiet_logs import quiet_cognate_config_warning

    with quiet_cognate_config_warning():  # Aegis' own model types: transformers' "model of type" warning is noise
        tok = AutoTokenizer.from_pretrained(tok_dir, trust_remote_code=False)  # a Cognate auto_map: no prompt
    ids = _prompt_ids(tok, prompt)
    cfg = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    engine_only = ("bitnet_config.json", "quietstar.json")  # packed ternary weights, Quiet-STaR thoughts
    if cfg.get("auto_map") and not any((folder / name).is_file() for name in engine_only):
        return _remote_code(folder, tok, ids, max_new_tokens, temperature, seed, on_text)
    return _engine_generate(folder, tok, ids, max_new_tokens, temperature, seed, show_thoughts, on_text)


def _engine_generate(folder, tok, ids, max_new, temperature, seed, show_thoughts, on_text) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from aegis.forge.quietstar.core import ThoughtSpec, mix_weight
    from aegis.forge.quietstar.run import load_quietstar_model

    model, params, kind = _engine(folder)
    qs = load_quietstar_model(folder)
    length = len(ids) + max_new
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    spec = None
    if qs is not None:
        meta, mixer = qs
        mixer = {k: jnp.asarray(v) for k, v in mixer.items()}
        spec = ThoughtSpec(tok.convert_tokens_to_ids(meta["start_token"]), tok.convert_tokens_to_ids(meta["end_token"]),
                           pad, int(meta["thought_length"]), 1, 1)
        kind += ", Quiet-STaR"
        length += spec.length + 2
    thought_ids = jnp.asarray([tok.convert_tokens_to_ids(t) for t in (meta["tokens"] if qs else [])] or [pad])

    @jax.jit
    def step_logits(buf, at):
        h = model.hidden(params, buf[None])[0]
        return jax.nn.log_softmax(model.project(h[at], model.head_weight(params))), h[at]

    key = jax.random.key(seed)
    out: list[int] = []
    thoughts: list[str] = []
    text_so_far = ""
    buf = jnp.full((length,), pad, jnp.int32).at[: len(ids)].set(jnp.asarray(ids, jnp.int32))
    n = len(ids)
    for _ in range(max_new):
        key, k1, k2 = jax.random.split(key, 3)
        lp, h_base = step_logits(buf, n - 1)
        if spec is not None:  # a thought after the context, then the mixed prediction
            tb = buf.at[n].set(spec.start_id)
            t_ids = []
            end = n + 1 + spec.length  # the forced end marker, unless the model closes the thought first
            for t in range(spec.length):
                tl, _ = step_logits(tb, n + t)
                tl = tl.at[spec.start_id].set(-jnp.inf)
                nxt = int(jnp.argmax(tl))
                tb = tb.at[n + 1 + t].set(nxt)
                if nxt == spec.end_id:  # as Quiet-STaR's training reads it (`core.thought_ends`)
                    end = n + 1 + t
                    break
                t_ids.append(nxt)
            tb = tb.at[end].set(spec.end_id)
            lp_post, h_post = step_logits(tb, end)
            w = mix_weight(mixer, h_base, h_post)
            lp = jnp.logaddexp(jnp.log(w + 1e-9) + lp_post, jnp.log1p(-w + 1e-9) + lp)
            lp = lp.at[thought_ids].set(-jnp.inf)
            thoughts.append(tok.decode(t_ids))
        nxt = int(jnp.argmax(lp)) if temperature <= 0 else int(jax.random.categorical(k2, lp / temperature))
        if spec is not None and show_thoughts:
            on_text(f"[{thoughts[-1].strip()}]")
        out.append(nxt)
        buf = buf.at[n].set(nxt)
        n += 1
        text = tok.decode(out, skip_special_tokens=True)
        on_text(text[len(text_so_far):])
        text_so_far = text
        if nxt == tok.eos_token_id:
            break
    del np
    return {"text": text_so_far, "tokens": out, "kind": kind, "thoughts": thoughts, "halting_steps": None}


def _remote_code(folder, tok, ids, max_new, temperature, seed, on_text) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    out: list[int] = []
    halting: list[float] = []
    text_so_far = ""
    with torch.no_grad():
        for _ in range(max_new):
            res = model(x)
            for name in ("halting_steps", "num_steps", "ponder_steps"):
                v = getattr(res, name, None)
                if v is not None:
                    halting.append(float(torch.as_tensor(v, dtype=torch.float32).flatten()[-1]))
                    break
            logits = res.logits[0, -1].float()
            nxt = int(logits.argmax()) if temperature <= 0 else int(torch.multinomial(torch.softmax(logits / temperature, -1), 1))
            out.append(nxt)
            x = torch.cat([x, torch.tensor([[nxt]])], 1)
            text = tok.decode(out, skip_special_tokens=True)
            on_text(text[len(text_so_far):])
            text_so_far = text
            if nxt == tok.eos_token_id:
                break
    return {"text": text_so_far, "tokens": out, "kind": "remote code (trust_remote_code)", "thoughts": [],
            "halting_steps": halting or None}
