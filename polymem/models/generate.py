"""Text generation with a pretrained causal LM, with or without a memory site: greedy or sampled decoding over
the model's KV cache, streaming each row's new text, timed.

Each prompt is tokenized alone (the model's tokenizer, no special tokens) and starts from the model's BOS token
where it has one. Prompts of one batch must be the same number of tokens: a memory site hashes the ids it is
given, so left padding would put pad ids into the first n-grams of a shorter prompt and change its output.
:func:`generate` therefore batches prompts of equal length together (up to ``batch`` rows) and decodes each
group on its own. A row stops at the model's EOS token, after ``max_new_tokens``, or when the sequence fills the
model's context (``max_position_embeddings``); a prompt that fills it alone is refused.

Sampling: ``temperature`` 0 is greedy (argmax); above 0, logits / temperature, then nucleus (``top_p``) sampling
from a ``torch.Generator`` seeded with ``seed``, so a run is reproducible on one machine.

Not here: loading models (:mod:`.registry`), attaching a site (:func:`polymem.torch.attach.load_attached`), the
CLI (``polymem generate``).
"""

from __future__ import annotations

import codecs
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from polymem.errors import PolymemError

MAX_PROMPTS_BYTES = 64 << 20  # prompts are decoded one by one; a bigger file is a corpus, not prompts


def read_prompts(path: str | os.PathLike[str]) -> list[str]:
    """The prompts of a UTF-8 text file, one per line (blank lines skipped): a regular file of at most 64 MiB
    (:func:`polymem._io.read_bounded`: a FIFO is refused at once, never waited on); one PolymemError otherwise."""
    from polymem._io import read_bounded

    data = read_bounded(path, what="prompts file", max_bytes=MAX_PROMPTS_BYTES, error=PolymemError,
                        fix="pass a text file of prompts, one per line")
    try:
        return [ln for ln in data.decode("utf-8").splitlines() if ln.strip()]
    except UnicodeDecodeError as e:
        raise PolymemError(f"{str(path)!r} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None


@dataclass
class Decoding:
    """How to pick each next token."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def check(self) -> "Decoding":
        if not (isinstance(self.max_new_tokens, int) and not isinstance(self.max_new_tokens, bool)
                and self.max_new_tokens >= 1):
            raise PolymemError(f"max_new_tokens={self.max_new_tokens!r} must be a whole number >= 1, e.g. 64")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise PolymemError(f"temperature={self.temperature!r} must be a finite number >= 0 (0 = greedy), e.g. 0.8")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise PolymemError(f"top_p={self.top_p!r} must be in (0, 1] (1 = no nucleus cut), e.g. 0.9")
        return self


@dataclass
class Generated:
    """One prompt's result: its prompt and new token ids, the new text, and why it stopped."""

    prompt: str
    prompt_ids: list[int]
    new_ids: list[int] = field(default_factory=list)
    text: str = ""
    stopped: str = "length"  # "length" | "eos" | "context" (the sequence filled the model's context)


def next_token(logits: torch.Tensor, d: Decoding, gen: torch.Generator | None) -> torch.Tensor:
    """logits [B, V] -> next ids [B] (greedy when temperature is 0)."""
    if d.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float().cpu() / d.temperature, dim=-1)  # the generator lives on the CPU
    if d.top_p < 1:
        sp, si = probs.sort(dim=-1, descending=True)
        keep = sp.cumsum(dim=-1) - sp < d.top_p  # the smallest prefix whose mass reaches top_p (always >= 1)
        sp = sp * keep
        pick = torch.multinomial(sp / sp.sum(dim=-1, keepdim=True), 1, generator=gen).squeeze(-1)
        return si.gather(-1, pick.unsqueeze(-1)).squeeze(-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def context_length(model: Any) -> int | None:
    """The model's context in tokens (its config's ``max_position_embeddings``), or None where it declares none."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def _groups(lengths: Sequence[int], batch: int) -> list[list[int]]:
    """Prompt indices grouped by token length (first-seen order), each group cut into batches of <= batch."""
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    return [ix[s:s + batch] for ix in by_len.values() for s in range(0, len(ix), batch)]


def generate(lm: Any, prompts: Sequence[str], decoding: Decoding, *, batch: int = 1, handle: Any = None,
             on_text: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Decode ``prompts`` with ``lm`` (a :class:`polymem.models.LoadedModel`; with ``handle``, its attached site
    is reset before each group). ``on_text(i, piece)`` receives each prompt's new text as it is decoded.

    Returns ``{"results": [Generated, ...], "new_tokens", "prompt_tokens", "prefill_s", "decode_s",
    "tokens_per_s"}``: tokens/s counts new tokens over the decoding steps after the prefill (the prompt's
    forward), summed over groups; a batch of b rows makes b tokens per step."""
    d = decoding.check()
    if not (isinstance(batch, int) and batch >= 1):
        raise PolymemError(f"batch={batch!r} must be a whole number >= 1")
    if not prompts:
        raise PolymemError("no prompt given; pass --prompt TEXT or --prompts FILE (one prompt per line)")
    tok, model = lm.tokenizer, lm.model
    lead = [lm.bos_id] if lm.bos_id is not None else []
    results = []
    for p in prompts:
        ids = lead + [int(t) for t in tok.encode(p)]
        if not ids:
            raise PolymemError(f"prompt {p!r} has no tokens and the model has no BOS token to start from; give it text")
        results.append(Generated(p, ids))
    ctx = context_length(model)
    if ctx is not None:
        longest = max(results, key=lambda r: len(r.prompt_ids))
        if len(longest.prompt_ids) >= ctx:
            raise PolymemError(
                f"prompt {longest.prompt[:40]!r}… is {len(longest.prompt_ids):,} tokens, the model's context is "
                f"{ctx:,} (max_position_embeddings): nothing is left to generate; shorten the prompt to under "
                f"{ctx:,} tokens")
    token_bytes = tok.all_token_bytes()
    eos = lm.eos_id
    device = next(model.parameters()).device
    import inspect

    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # transformers >= 5.24
    # the prompt's forward computes the output layer at its last position only (all a step needs): on Gemma 3
    # the output layer is 262,144 × 640 scalars a position
    last_kw = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    gen = torch.Generator(device="cpu").manual_seed(int(d.seed)) if d.temperature > 0 else None
    prefill_s = decode_s = 0.0
    new_tokens = 0
    for group in _groups([len(r.prompt_ids) for r in results], batch):
        if handle is not None:
            handle.reset()
        decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in group]
        live = list(range(len(group)))
        step_ids = torch.tensor([results[i].prompt_ids for i in group], dtype=torch.long, device=device)
        past = None
        t0 = time.perf_counter()
        room = d.max_new_tokens if ctx is None else min(d.max_new_tokens, ctx - step_ids.shape[1])
        for step in range(room):
            with torch.no_grad():
                out = model(input_ids=step_ids, use_cache=True, **{cache_kw: past}, **last_kw)
            past = getattr(out, "cache", None) or out.past_key_values
            nxt = next_token(out.logits[:, -1, :], d, gen).to("cpu")
            t1 = time.perf_counter()
            if step == 0:
                prefill_s += t1 - t0
            else:
                decode_s += t1 - t0
                new_tokens += len(live)
            t0 = t1
            for j in list(live):
                r, t = results[group[j]], int(nxt[j])
                if eos is not None and t == eos:
                    r.stopped = "eos"
                    live.remove(j)
                    continue
                r.new_ids.append(t)
                piece = decoders[j].decode(token_bytes[t] or b"")
                r.text += piece
                if on_text is not None and piece:
                    on_text(group[j], piece)
            if not live:
                break
            if step == room - 1 and room < d.max_new_tokens:
                for j in live:
                    results[group[j]].stopped = "context"  # the sequence filled the model's context
                break
            step_ids = nxt.view(-1, 1).to(device)  # rows that stopped keep decoding (discarded): the batch stays whole
        for j, i in enumerate(group):
            tail = decoders[j].decode(b"", final=True)
            results[i].text += tail
            if on_text is not None and tail:
                on_text(i, tail)
    return {"results": results, "new_tokens": new_tokens, "prompt_tokens": sum(len(r.prompt_ids) for r in results),
            "prefill_s": prefill_s, "decode_s": decode_s,
            "tokens_per_s": new_tokens / decode_s if decode_s > 0 else None}
