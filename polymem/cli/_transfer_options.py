"""The options of ``polymem transfer --model``, in frozen groups that :mod:`polymem.cli.cmd_transfer` builds once
from its flags and :func:`polymem.cli._transfer_model.transfer_model` reads:

* :class:`RecipientOptions` — the pretrained recipient: its model, device and precision, its training budget
  (:class:`polymem.recipes.frozen.FrozenTrainConfig`), its sites (:class:`polymem.recipes.options.RecipientSite`)
  and the steps its learning curve is scored at;
* :class:`DonorOptions` — the donor: its table and its model;
* the data: :class:`polymem.recipes.options.ExperimentData` (training documents and scoring sets);
* :class:`RunOptions` — which arms and seeds, where results go, threads;
* :class:`ContentStudyOptions` — the content study (``--content-split`` and the donor's training and text);
* :class:`ModelTransfer` — all of them, with the checks that need more than one group.

Each group checks its values when it is made; a bad one is one line naming the flag, the value and what is
accepted. Nothing here loads a model or touches the disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from polymem.errors import PolymemError
from polymem.recipes.arms import ARM_SPECS, ARMS, check_arms
from polymem.recipes.frozen import FrozenTrainConfig
from polymem.recipes.options import ExperimentData, RecipientSite

if TYPE_CHECKING:
    from polymem.recipes.content import ContentOptions

PRECISIONS = ("auto", "fp32", "bf16")


def seed_ids(seeds: int, seed_list: str | None) -> tuple[int, ...]:
    """``--seed-list`` (comma-separated) or else 0..``--seeds``-1."""
    if seed_list is None:
        return tuple(range(seeds))
    try:
        out = [int(x) for x in seed_list.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(not 0 <= s < 2**32 for s in out):
        raise PolymemError(f"--seed-list {seed_list!r} must be comma-separated seeds in 0..4294967295, e.g. 0,1,2")
    return tuple(dict.fromkeys(out))


def eval_steps(eval_at: str | None, eval_every: int | None, steps: int) -> tuple[int, ...]:
    """The steps the in-domain set is scored after: every ``--eval-every``, those of ``--eval-at``, and the last."""
    pts: set[int] = {steps}
    if eval_every:
        pts |= set(range(eval_every, steps + 1, eval_every))
    if eval_at:
        try:
            got = [int(x) for x in eval_at.split(",") if x.strip()]
        except ValueError:
            got = []
        if not got or any(not 1 <= p <= steps for p in got):
            raise PolymemError(f"--eval-at {eval_at!r} must be comma-separated steps in 1..{steps} (--steps), e.g. "
                               f"4,12,24,{steps}")
        pts |= set(got)
    return tuple(sorted(pts))


@dataclass(frozen=True, kw_only=True)
class RecipientOptions:
    """The pretrained recipient, how it runs, trains and is scored along the way."""

    model: str  # --model: a builtin name, a .gguf file, a checkpoint folder, hf:ORG/NAME
    budget: FrozenTrainConfig  # --steps --batch-size --block-size --site-lr --table-lr --softmax
    site: RecipientSite = RecipientSite()  # --layers --max-n --gate --init --donor-site
    eval_every: int | None = None  # --eval-every: score the in-domain set every this many steps
    eval_at: str | None = None  # --eval-at: and after these steps ("4,12,24")
    device: str = "auto"  # --device
    precision: str = "auto"  # --precision of the frozen backbone: auto, fp32 or bf16
    points: tuple[int, ...] = field(init=False)  # the steps scored (eval_every, eval_at and the last)

    def __post_init__(self) -> None:
        if self.eval_every is not None and (not isinstance(self.eval_every, int) or self.eval_every < 1):
            raise PolymemError(f"--eval-every {self.eval_every!r} must be a whole number of steps >= 1, e.g. "
                               "--eval-every 10")
        if self.precision not in PRECISIONS:
            raise PolymemError(f"--precision {self.precision!r} is unknown; accepted: {', '.join(PRECISIONS)}, e.g. "
                               "--precision auto")
        object.__setattr__(self, "points", eval_steps(self.eval_at, self.eval_every, self.budget.steps))


@dataclass(frozen=True, kw_only=True)
class DonorOptions:
    """The donor: its table, and the model it was trained with (what an aligned start and the content study load)."""

    asset: str | None = None  # --asset: the donor table (with --content-split: optional, one trained on its part)
    model: str | None = None  # --donor-model (default: the one the asset's provenance names)


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Which arms and seeds run, where each result is written and what else is written."""

    out_dir: Path | None  # --out-dir: one result file per (arm, seed); needed (a stopped run resumes from it)
    arms: tuple[str, ...] = ARMS  # --arms, kept in the registry's order (polymem.recipes.arms)
    seeds: tuple[int, ...] = (0, 1, 2)  # --seeds N (0..N-1) or --seed-list
    threads: int | None = None  # --threads
    json_out: Path | None = None  # --json
    plot: Path | None = None  # --plot

    def __post_init__(self) -> None:
        if self.out_dir is None:
            raise PolymemError("--model needs --out-dir DIR: each (arm, seed) result is written there as it ends, so a "
                               "stopped run resumes; e.g. --out-dir runs/gemma")
        object.__setattr__(self, "arms", tuple(check_arms(self.arms)))
        if not self.seeds or any(not isinstance(s, int) or not 0 <= s < 2**32 for s in self.seeds):
            raise PolymemError(f"seeds {self.seeds!r} (--seeds N, or --seed-list) must be one or more whole numbers in "
                               "0..4294967295, e.g. --seed-list 0,1,2")
        object.__setattr__(self, "seeds", tuple(dict.fromkeys(self.seeds)))
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise PolymemError(f"--threads {self.threads!r} must be a whole number >= 1, e.g. --threads 2")

    @property
    def folder(self) -> Path:
        """--out-dir (never None once made)."""
        assert self.out_dir is not None  # refused in __post_init__
        return self.out_dir


@dataclass(frozen=True, kw_only=True)
class ContentStudyOptions:
    """``--content-split`` and what the content study's donor trains and writes (each refused without a split)."""

    split: str | None = None  # --content-split: donor,recipient,unseen shares of --corpus's documents
    split_seed: int = 0  # --split-seed
    donor_steps: int = 80  # --donor-steps: the donor's training steps on its part
    donor_params: str = "20M"  # --donor-params: the donor table's size in scalars
    teach_tokens: int = 4096  # --teach-tokens
    teach_select: float = 1.0  # --teach-select
    teach_prompts: str = "recipient"  # --teach-prompts: recipient or donor
    byte_head: int = 0  # --donor-byte-head: bytes the donor's byte decoder predicts after each n-gram (0: none)

    def __post_init__(self) -> None:
        from polymem.cli._options import refuse_unused

        if self.split is None:
            refuse_unused("without --content-split", {
                "split_seed": (self.split_seed, 0), "donor_steps": (self.donor_steps, 80),
                "donor_params": (self.donor_params, "20M"), "teach_tokens": (self.teach_tokens, 4096),
                "teach_select": (self.teach_select, 1.0), "teach_prompts": (self.teach_prompts, "recipient"),
                "donor_byte_head": (self.byte_head, 0)})
            return
        if self.byte_head:
            from polymem.torch.bytehead import check_bytes

            check_bytes(self.byte_head, "--donor-byte-head")
        from polymem.recipes.content import ContentSplit
        from polymem.recipes.teach import TeachConfig

        ContentSplit.parse(self.split, seed=self.split_seed)  # said now; the donor's size is read only to train one
        TeachConfig(tokens=self.teach_tokens, select=self.teach_select, prompts_from=self.teach_prompts)

    def study(self, asset: str | None, budget: FrozenTrainConfig,
              layers: Sequence[int] | None = None) -> ContentOptions | None:
        """The study as :class:`polymem.recipes.content.ContentOptions` (None without a split): with ``asset``, a
        donor trained before on exactly its part; else one trained here with the recipient's ``budget`` (its batch,
        block, learning rates and loss) on ``layers`` (default block 2)."""
        from polymem.cli._options import parse_count
        from polymem.recipes.content import ContentOptions, ContentSplit
        from polymem.recipes.teach import TeachConfig

        if self.split is None:
            return None
        sp = ContentSplit.parse(self.split, seed=self.split_seed)
        teach = TeachConfig(tokens=self.teach_tokens, select=self.teach_select, prompts_from=self.teach_prompts)
        if asset is not None:
            if self.byte_head:
                raise PolymemError("--donor-byte-head trains the donor here, and --asset gives one trained before; "
                                   "drop one")
            return ContentOptions(split=sp, donor_asset=asset, teach=teach)
        cfg = FrozenTrainConfig(steps=self.donor_steps, batch_size=budget.batch_size, block_size=budget.block_size,
                                layers=tuple(layers or (2,)), params=parse_count(self.donor_params), site_lr=budget.site_lr,
                                table_lr=budget.table_lr, softmax=budget.softmax)
        return ContentOptions(split=sp, donor_cfg=cfg, teach=teach, byte_head=self.byte_head)


@dataclass(frozen=True, kw_only=True)
class ModelTransfer:
    """Every option of ``polymem transfer --model``, and the checks across groups (what reads what)."""

    recipient: RecipientOptions
    donor: DonorOptions
    data: ExperimentData
    run: RunOptions
    content: ContentOptions | None = None  # the study of what the donor read (--content-split), or None

    def __post_init__(self) -> None:
        d, site, run, content = self.donor, self.recipient.site, self.run, self.content
        if d.asset is None and content is None:
            raise PolymemError("--asset is needed: the donor table the recipient reads (or --content-split, which "
                               "trains the donor on its part of --corpus)")
        taught = [a for a in run.arms if ARM_SPECS[a].teach]
        if content is None and taught:
            raise PolymemError(f"the {' and '.join(taught)} arm(s) learn from text the donor model writes with its "
                               "table, or from its predictions on the recipient's part, which the content study "
                               "prepares; add --content-split (with --donor-model) or drop them from --arms")
        polished = [a for a in run.arms if ARM_SPECS[a].decoder == "polished"]
        if content is None and polished:
            raise PolymemError(f"the {' and '.join(polished)} arm reads the donor's byte decoder trained on over the "
                               "donor's own documents, which the content study has; add --content-split (with "
                               "--donor-model and --donor-byte-head) or drop it from --arms")
        if content is not None and any(ARM_SPECS[a].teach == "written" for a in taught):
            from polymem.recipes.teach import TeachConfig, check_teach_disk

            check_teach_disk(content.teach or TeachConfig(), run.out_dir)
        if content is None and site.init != "aligned" and d.model:
            raise PolymemError("--donor-model is read only with --init aligned or --content-split; add one or drop it")
        if (content is None and site.init != "aligned" and site.donor_site
                and not any(ARM_SPECS[a].stitch for a in run.arms)):
            raise PolymemError("--donor-site is read only with --init aligned or the stitch arm; add one or drop it")
        if content is not None and (site.donor_site or run.plot):
            raise PolymemError("--donor-site and --plot are not read with --content-split (the donor's site is the one "
                               "trained with it); drop them")
