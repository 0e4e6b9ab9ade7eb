"""What a pretrained-transfer :class:`polymem.recipes.pretrained.Experiment` is prepared from, in two frozen
groups: the data (:class:`ExperimentData`: what trains, what is scored and how much of it) and the recipient's
sites (:class:`RecipientSite`: where, which orders, which gate, how the projection starts). The training budget
is :class:`polymem.recipes.frozen.FrozenTrainConfig`.

Each group checks its own values when it is made, and a bad one is one line naming the option (its command-line
flag), the value and what is accepted. Not here: the checks that need the donor or the model (the
:class:`Experiment` makes those), the command's own options (:mod:`polymem.cli._transfer_options`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from polymem.errors import PolymemError

DONOR_INITS = ("zero", "orthogonal", "aligned")  # how the projection of the arms that read the donor's rows starts


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True, kw_only=True)
class ExperimentData:
    """The recipient's training documents and its scoring sets."""

    corpus: Sequence[str | Path] = ()  # --corpus: the training documents (files)
    texts: Sequence[str] | None = None  # the training documents themselves, instead of ``corpus``
    eval_corpora: Sequence[str | Path] = ()  # --eval-corpus: one more scoring set per file (its held-out split)
    eval_texts: Mapping[str, Sequence[str]] | None = None  # more scoring sets, by name
    # every this many documents of ``corpus`` is held out and scored; None: the donor's own split (else 10);
    # 0: every document trains, and only ``eval_corpora`` / ``eval_texts`` are scored
    heldout_every: int | None = None
    eval_tokens: int = 4096  # --eval-tokens: tokens per scoring set (its first documents)
    doc_tokens: int | None = None  # each scored document's first tokens (None: eval_tokens // 8)
    window: int = 512  # the scoring window in tokens

    def __post_init__(self) -> None:
        if self.texts is None and not self.corpus:
            raise PolymemError("no training documents: pass corpus (--corpus FILE) or texts")
        if not _int(self.eval_tokens) or self.eval_tokens < 1:
            raise PolymemError(f"--eval-tokens {self.eval_tokens!r} must be an integer >= 1 (tokens per scoring set), "
                               "e.g. --eval-tokens 4096")
        if not _int(self.window) or self.window < 2:
            raise PolymemError(f"window {self.window!r} must be an integer >= 2 (the scoring window in tokens), e.g. 512")
        if self.doc_tokens is not None and (not _int(self.doc_tokens) or self.doc_tokens < 1):
            raise PolymemError(f"doc_tokens {self.doc_tokens!r} must be an integer >= 1 (tokens per scored "
                               "document), or None for eval_tokens // 8")
        if self.heldout_every is not None and (not _int(self.heldout_every) or self.heldout_every < 0):
            raise PolymemError(f"heldout_every {self.heldout_every!r} must be an integer >= 0 (0: every document "
                               "trains), or None for the donor's own split")


@dataclass(frozen=True, kw_only=True)
class RecipientSite:
    """Where the recipient's sites go and how they start (None: the donor's own setting)."""

    layers: Sequence[int] | None = None  # --layers: a site before each of these blocks (kept as a tuple)
    max_n: int | None = None  # --max-n: n-gram orders 1..max_n
    gate: str | None = None  # --gate: scalar, context or count
    init: str = "zero"  # --init: how the projection of the arms that read the donor's rows starts (DONOR_INITS)
    # --donor-site: the donor's site folder, read by the aligned start and the stitch arm (None: the asset's
    # path + ".site", as `polymem train --model` writes it)
    donor_site: str | Path | None = None

    def __post_init__(self) -> None:
        from polymem.hash.spec import MAX_ORDER
        from polymem.torch.site import GATES

        if self.init not in DONOR_INITS:
            raise PolymemError(f"--init {self.init!r} is unknown; accepted: {', '.join(DONOR_INITS)}, e.g. --init aligned")
        if self.gate is not None and self.gate not in GATES:
            raise PolymemError(f"--gate {self.gate!r} is unknown; accepted: {', '.join(GATES)}, e.g. --gate context")
        if self.max_n is not None and (not _int(self.max_n) or not 1 <= self.max_n <= MAX_ORDER):
            raise PolymemError(f"--max-n {self.max_n!r} must be an integer in 1..{MAX_ORDER}, e.g. --max-n 3")
        if self.layers is not None:
            if not self.layers or any(not _int(x) or x < 0 for x in self.layers):
                raise PolymemError(f"--layers {self.layers!r} must be block indices >= 0, e.g. --layers 1 or 1,3")
            object.__setattr__(self, "layers", tuple(self.layers))
