"""Documents for the recipes: read a corpus into texts and split it into training and held-out documents.

Every recipe holds out the same documents: index i is held out when i % heldout_every == heldout_every - 1, so
a donor, its recipients (scratch or pretrained) and ``polymem eval`` never score a document a table trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

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
    """(train, held-out): document i is held out when i % heldout_every == heldout_every - 1."""
    if heldout_every < 2:
        raise PolymemError(f"heldout_every={heldout_every} must be >= 2 (every k-th document is held out)")
    if len(texts) < heldout_every:
        raise PolymemError(f"{len(texts)} documents: need at least {heldout_every} to hold one out (lower heldout_every)")
    train = [t for i, t in enumerate(texts) if i % heldout_every != heldout_every - 1]
    held = [t for i, t in enumerate(texts) if i % heldout_every == heldout_every - 1]
    return train, held
