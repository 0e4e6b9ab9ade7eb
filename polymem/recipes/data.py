"""Documents for the recipes: read a corpus into texts and split it into training and held-out documents.

Every recipe holds out the same documents: index i is held out when i % heldout_every == heldout_every - 1, so
a donor, its recipients (scratch or pretrained) and ``polymem eval`` never score a document a table trained on.
``heldout_every=0`` holds out nothing: every document is trained on (the run scores another set, or says it
scores what it read). :func:`corpus_read` says how much of a training stream a run's windows read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from polymem.errors import PolymemError


def read_documents(paths: Sequence[str | Path], text_field: str = "text") -> list[str]:
    """All document texts of ``paths`` (files, directories, .jsonl[.gz]) in order."""
    return [text for _, text in read_named_documents(paths, text_field)]


def read_named_documents(paths: Sequence[str | Path], text_field: str = "text") -> list[tuple[str, str]]:
    """(id, text) of every document of ``paths`` in order: the id is the JSONL record's "id", else its file (and
    line)."""
    from polymem.corpus import Corpus

    corpus = Corpus([str(p) for p in paths], text_field=text_field)
    docs = [(d.id, d.text) for d in corpus]
    if not docs:
        raise corpus.nothing_read()
    return docs


def split_documents(texts: Sequence[str], heldout_every: int = 10) -> tuple[list[str], list[str]]:
    """(train, held-out): document i is held out when i % heldout_every == heldout_every - 1; ``heldout_every=0``:
    every document trains, none is held out."""
    if heldout_every == 0:
        return list(texts), []
    if heldout_every < 2:
        raise PolymemError(f"heldout_every={heldout_every} must be 0 (train on every document) or >= 2 (every k-th "
                           "document is held out)")
    if len(texts) < heldout_every:
        raise PolymemError(f"{len(texts)} documents: need at least {heldout_every} to hold one out (lower heldout_every)")
    train = [t for i, t in enumerate(texts) if i % heldout_every != heldout_every - 1]
    held = [t for i, t in enumerate(texts) if i % heldout_every == heldout_every - 1]
    return train, held


def corpus_read(n_tokens: int, starts: np.ndarray, width: int, offset: int = 0) -> dict[str, Any]:
    """How much of a training stream of ``n_tokens`` tokens a run read, given its window starts (any shape) and
    that the window at ``s`` predicts the tokens ``stream[s + offset : s + offset + width]``.

    ``share_read``: share of the stream's tokens predicted by at least one window; ``passes``: tokens predicted
    (``starts.size * width``) over the stream's tokens. E.g. 10 tokens, windows of 4 at 0 and 2:
    6 of 10 tokens read (0.6), 0.8 passes."""
    n = int(n_tokens)
    s = np.asarray(starts, dtype=np.int64).reshape(-1) + int(offset)
    edge = np.zeros(n + 1, dtype=np.int64)  # +1 where a window begins, -1 where it ends: covered where the sum > 0
    np.add.at(edge, np.clip(s, 0, n), 1)
    np.add.at(edge, np.clip(s + int(width), 0, n), -1)
    covered = int(np.count_nonzero(np.cumsum(edge[:-1]))) if n else 0
    seen = int(s.size) * int(width)
    return {"train_tokens": n, "tokens_seen": seen, "tokens_read": covered,
            "share_read": covered / n if n else 0.0, "passes": seen / n if n else 0.0}
