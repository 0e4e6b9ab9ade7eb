"""The arms of the pretrained transfer (:mod:`polymem.recipes.pretrained`), one row each in :data:`ARM_SPECS`.

An arm is what the recipient's memory is while everything else (data order, budget, site initialisation) stays
the same: where its table's rows come from, what trains, how the site's projection starts, what it learns from,
and any extra term of its loss. :func:`polymem.recipes.pretrained.run_arm` reads these properties and nothing
else, so a new arm is one :class:`Arm` row here (and, when it learns from something new, one small function that
builds its extra loss term or its key, as ``distill`` has). Its training step is the one every arm runs
(:func:`polymem.recipes.frozen.train_site` over :func:`polymem.recipes.loop.run_steps`): the arm chooses the
stream it reads and the extra term.

Not here: the training step, scoring, the comparisons between arms (:mod:`polymem.recipes.verdicts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from polymem.errors import PolymemError

AuxLoss = Callable[[torch.Tensor, np.ndarray], torch.Tensor]  # (per-token nats [B, T], window starts [B]) -> loss
ROWS = ("none", "random", "null", "donor", "empty")  # where an arm's table rows come from
TEXTS = ("written", "own")  # what a taught arm reads: text the donor model writes, or the recipient's own part
VALUE_INITS = ("zero", "orthogonal", "init")  # how its projection starts; "init": the run's --init


@dataclass(frozen=True, kw_only=True)
class Arm:
    """One arm: its memory, what trains, what it learns from (see the module docstring)."""

    name: str
    method: str  # what its memory is, as the results files name it
    rows: str  # "none" (no table: the model alone), "random" (the donor's layout and row norms, random rows),
    # "null" (one row every n-gram reads), "donor" (the donor's rows), "empty" (the donor's layout, zero rows)
    trains: str | None  # "projection" (the site only) or "table" (the site and the table's rows); None: nothing
    value_init: str = "init"  # the site projection's start: "zero", "orthogonal" or "init" (the run's --init)
    default: bool = False  # in the default set of --arms (else run only when named)
    stitch: bool = False  # the donor's own site, frozen, replaces the fresh one behind a learned stitch
    teach: str | None = None  # learns from a text with the donor model's targets on it (the content study prepares
    # it): "written" (text the donor writes with its table) or "own" (the recipient's own part, which the donor
    # with its table scores); None: the recipient's part, hard targets only
    aux: Callable[[Any], AuxLoss] | None = None  # experiment -> an extra term of each step's loss
    key: Callable[[Any], str] | None = None  # experiment -> what else determines its results (added to the key)
    reader: str | None = None  # the donor's byte decoder read beside the site (next bytes), its weights trained
    # with it: "add" (scores added to the logits) or "mix" (probabilities interpolated)
    hits: str = "any"  # the reader reads an n-gram's rows when any of its K head rows was written, or "all"
    decoder: str = "donor"  # the reader's decoder: the donor's, or "polished" (trained on over the donor's part)
    run: Callable[..., dict[str, Any]] | None = None  # an arm with a training of its own, not a site's:
    # run(exp, arm, seed, eval_at=..., on_event=...) -> its result (the next-bytes arms, polymem.recipes.nextbytes)

    def __post_init__(self) -> None:
        if self.rows not in ROWS or self.trains not in ("projection", "table", None) or self.value_init not in VALUE_INITS:
            raise PolymemError(f"arm {self.name!r}: rows {self.rows!r} (accepted: {', '.join(ROWS)}), trains "
                               f"{self.trains!r} (projection, table or None), value_init {self.value_init!r} "
                               f"(accepted: {', '.join(VALUE_INITS)})")
        if self.decoder not in ("donor", "polished"):
            raise PolymemError(f"arm {self.name!r}: decoder {self.decoder!r} (accepted: donor, polished)")
        if self.teach not in (None, *TEXTS):
            raise PolymemError(f"arm {self.name!r}: teach {self.teach!r} (accepted: {', '.join(TEXTS)} or None)")
        if (self.rows == "none") != (self.trains is None):
            raise PolymemError(f"arm {self.name!r}: an arm without a table trains nothing, and every other one trains")

    @property
    def fine_tunes_donor(self) -> bool:
        """The donor's rows train (the results say how far they drifted)."""
        return self.rows == "donor" and self.trains == "table"

    @property
    def frozen_donor(self) -> bool:
        """The donor's rows are read and must not change (checked after training)."""
        return self.rows == "donor" and self.trains != "table"


def taught(exp: Any, spec: Arm) -> Any:
    """The text a taught arm reads, with the donor's chunk targets on it (polymem.recipes.teach.TeachData); None
    when the experiment has not prepared it."""
    return exp.teach if spec.teach == "written" else exp.teach_own


def _teach_key(exp: Any) -> str:
    return "-" + exp.teach.digest


def _distill_key(exp: Any) -> str:
    return _teach_key(exp) + f"-w{exp.teach_cfg.distill_weight:g}"


def _own_key(exp: Any) -> str:
    return f"-own{exp.teach_own.digest}-w{exp.teach_cfg.distill_weight:g}"


def _chunk_loss(data: Any, exp: Any) -> AuxLoss:
    """The donor's chunk likelihoods on ``data`` matched across the tokenizers
    (:func:`polymem.recipes.teach.chunk_loss`)."""
    from polymem.recipes.teach import chunk_loss

    w, bos = exp.teach_cfg.distill_weight, exp.lm.bos_id

    def aux(nats: torch.Tensor, starts: np.ndarray) -> torch.Tensor:
        return w * chunk_loss(data, nats, starts, bos)

    return aux


def _distill_loss(exp: Any) -> AuxLoss:
    return _chunk_loss(exp.teach, exp)


def _own_loss(exp: Any) -> AuxLoss:
    return _chunk_loss(exp.teach_own, exp)


def _polish_key(exp: Any) -> str:
    from polymem.torch.bytehead import FIT_BATCH, POLISH_LR, POLISH_STEPS

    return f"-polish{POLISH_STEPS}x{FIT_BATCH}lr{POLISH_LR:g}-eos"  # the donor's documents joined by EOS


def _next_bytes(exp: Any, arm: str, seed: int, **kw: Any) -> dict[str, Any]:
    from polymem.recipes.nextbytes import run_next_bytes

    return run_next_bytes(exp, arm, seed, **kw)


ARM_SPECS: dict[str, Arm] = {a.name: a for a in (
    Arm(name="none", method="the model alone", rows="none", trains=None, default=True),
    Arm(name="random", method="a frozen random table of the donor's layout, fresh site", rows="random",
        trains="projection", value_init="zero", default=True),
    Arm(name="null", method="a one-row table, fresh site (no n-gram content)", rows="null", trains="table",
        value_init="orthogonal", default=True),
    Arm(name="donor", method="the donor's table frozen, a fresh site trained on the recipient's part", rows="donor",
        trains="projection", default=True),
    Arm(name="donor_finetune", method="the donor's table fine-tuned with a fresh site on the recipient's part",
        rows="donor", trains="table", default=True),
    Arm(name="in_place", method="a table of the donor's layout trained from zero on the recipient's part",
        rows="empty", trains="table", value_init="orthogonal", default=True),
    Arm(name="stitch", method="the donor's table and its own site frozen, a learned linear stitch between the residual "
                              "streams trained on the recipient's part",
        rows="donor", trains="projection", value_init="zero", stitch=True),
    Arm(name="teach", method="the donor's table fine-tuned with a fresh site on text the donor model wrote with its "
                             "table (hard targets)",
        rows="donor", trains="table", teach="written", key=_teach_key),
    Arm(name="distill", method="as teach, plus matching the donor's likelihoods of byte-aligned chunks (approximate "
                               "likelihood matching across the tokenizers)",
        rows="donor", trains="table", teach="written", key=_distill_key, aux=_distill_loss),
    Arm(name="distill_own", method="the donor's table frozen behind a fresh site trained on the recipient's part, on "
                                   "hard targets and matching the donor model's (with its table and site) likelihoods "
                                   "of byte-aligned chunks of the same text (distillation on the recipient's text)",
        rows="donor", trains="projection", teach="own", key=_own_key, aux=_own_loss),
    Arm(name="distill_own_mix", method="as distill_own, with the donor's byte decoder read beside the site as "
                                       "donor_next_bytes_mix does",
        rows="donor", trains="projection", teach="own", key=_own_key, aux=_own_loss, reader="mix"),
    Arm(name="next_bytes", method="the donor's table and its byte decoder (trained with the rows to predict the bytes "
                                  "after each n-gram) frozen; each recipient token scored by the decoded bytes of its "
                                  "spelling, added to the next-token logits with one learned weight per order",
        rows="donor", trains="projection", run=_next_bytes),
    Arm(name="donor_next_bytes", method="the donor's table frozen behind a fresh site, and the donor's byte decoder "
                                        "read beside it (next bytes, its scores added to the logits), its order weights "
                                        "trained with the site (polymem attach --next-bytes-reader add)",
        rows="donor", trains="projection", reader="add"),
    Arm(name="donor_next_bytes_mix", method="the donor's table frozen behind a fresh site, and the donor's byte decoder "
                                            "read beside it, its token probabilities interpolated with the model's (as "
                                            "next_bytes_mix), trained with the site: what polymem attach does by "
                                            "default with a donor that ships a decoder",
        rows="donor", trains="projection", reader="mix"),
    Arm(name="donor_next_bytes_mix_all", method="as donor_next_bytes_mix, the reader reading an n-gram only where "
                                                "all its K head rows were written (an unread n-gram that collides in only some heads reads nothing; polymem attach "
                                                "--next-bytes-hits all)",
        rows="donor", trains="projection", reader="mix", hits="all"),
    Arm(name="donor_next_bytes_mix_polished", method="as donor_next_bytes_mix, the donor's byte decoder trained on "
                                                     "alone over the donor's own part first (rows frozen, no model "
                                                     "forward; what a donor could ship)",
        rows="donor", trains="projection", reader="mix", decoder="polished", key=_polish_key),
    Arm(name="donor_next_bytes_mix_polished_all", method="as donor_next_bytes_mix_polished, the reader reading an "
                                                         "n-gram only where all its K head rows were written",
        rows="donor", trains="projection", reader="mix", decoder="polished", key=_polish_key, hits="all"),
    Arm(name="next_bytes_fit", method="as next_bytes, with the byte decoder fitted on the recipient's part instead of "
                                      "the donor's own",
        rows="donor", trains="projection", run=_next_bytes),
    Arm(name="next_bytes_conf", method="as next_bytes, each order's weight also scaled with the decoder's confidence "
                                       "in the row (its mean top-byte probability), both learned",
        rows="donor", trains="projection", run=_next_bytes),
    Arm(name="next_bytes_mix", method="as next_bytes, but interpolating probabilities: the model's distribution mixed "
                                      "with its reweighting by each order's byte scores, the mixture weights learned",
        rows="donor", trains="projection", run=_next_bytes),
)}
ARMS = tuple(a for a, s in ARM_SPECS.items() if s.default)  # the default set
EXTRA_ARMS = tuple(a for a, s in ARM_SPECS.items() if not s.default)  # run only when named
METHODS = {a: s.method for a, s in ARM_SPECS.items()}


def check_arms(arms: Sequence[str]) -> list[str]:
    """``arms`` stripped, checked and in the registry's order (an unknown name lists the known ones)."""
    arms = [a.strip() for a in arms if a.strip()]
    bad = [a for a in arms if a not in ARM_SPECS]
    if bad or not arms:
        raise PolymemError(f"arms {bad or arms!r} unknown; accepted: {', '.join(ARM_SPECS)}, e.g. --arms "
                           f"{','.join(ARMS)}")
    return [a for a in ARM_SPECS if a in arms]


def arm_spec(arm: str) -> Arm:
    check_arms([arm])
    return ARM_SPECS[arm]


def arm_table(arm: str, donor: torch.Tensor, *, spec: Any, layout: Any, orders: tuple[int, ...], seed: int,
              init: str = "zero", counts: Any = None) -> tuple[Any, Any, Any]:
    """(table, train mode, value_init) of one arm (no table: (None, None, None)). ``init``: the projection start
    of the arms that read the donor's rows; ``counts``: the donor's per-row training counts (what a
    gate="count" site reads; the random table gets them shuffled with its row norms)."""
    from polymem.torch.tables import SingleRowTable, TrainableTable, random_like

    a = arm_spec(arm)
    vinit = init if a.value_init == "init" else a.value_init
    if a.rows == "none":
        return None, None, None
    if a.rows == "random":
        t = TrainableTable(random_like(donor, seed=7919 + int(seed)), spec=spec, layout=layout, orders=orders,
                           trainable=a.trains == "table")
        if counts is not None:  # random_like's first draw is the permutation of the row norms: the same one
            g = torch.Generator().manual_seed(7919 + int(seed))
            t.set_counts(np.asarray(counts)[torch.randperm(layout.num_rows, generator=g).numpy()])
        return t, a.trains, vinit
    if a.rows == "null":
        return SingleRowTable(spec=spec, layout=layout, orders=orders), a.trains, vinit
    if a.rows == "donor":
        t = TrainableTable(donor, spec=spec, layout=layout, orders=orders, trainable=a.trains == "table")
        if counts is not None:
            t.set_counts(counts)
        return t, a.trains, vinit
    return TrainableTable(None, spec=spec, layout=layout, orders=orders), a.trains, vinit  # "empty"
