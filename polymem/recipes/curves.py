"""Reading learning curves of the transfer arms: the compute a donor saves, when scratch overtakes a frozen donor,
and paired per-seed comparisons.

A curve is held-out bits/byte at increasing recipient token counts (one run, scored every E steps). All functions
are pure (numbers in, numbers out); :func:`analyze` applies them to a ``run_transfer`` result.

Conventions:

* ``tokens_to_reach(tokens, bpb, target)``: the first budget at which the curve reaches ``target`` (bpb <= target),
  linearly interpolated between the two measured points around the crossing. Before the first point nothing is
  known, so a curve already at or below the target there gives ``(tokens[0], "at_or_before")`` (an upper bound);
  one that never reaches it gives ``(None, "not_reached")`` (scratch needs more than the run's budget).
* compute saved by arm A at budget b: ``need = tokens_to_reach(scratch, A(b))``; the extra fraction scratch needs
  is ``(need - b) / b`` (0.3 = scratch needs 30 % more tokens than A); negative when scratch gets there sooner.
* crossover: the first budget where ``scratch - other`` changes sign from positive to <= 0 (interpolated).

Caveat the docs repeat: intermediate points of one run are taken before the learning-rate decay (warmup-stable-
decay schedule), the last one after it, so the last point is lower than a continuation of the curve would suggest.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polymem.errors import PolymemError


def tokens_to_reach(tokens: Sequence[float], bpb: Sequence[float], target: float) -> tuple[float | None, str]:
    """(tokens, status) at which the curve first reaches ``target``; status "interpolated", "at_or_before" or
    "not_reached" (see the module docstring)."""
    t = np.asarray(tokens, dtype=float)
    y = np.asarray(bpb, dtype=float)
    if t.shape != y.shape or t.ndim != 1 or t.size == 0:
        raise PolymemError(f"a curve needs as many token counts as bpb values (got {t.shape} and {y.shape})")
    if np.any(np.diff(t) <= 0):
        raise PolymemError(f"curve token counts must increase strictly, got {t.tolist()}")
    if y[0] <= target:
        return float(t[0]), "at_or_before"
    for i in range(1, t.size):
        if y[i] <= target:
            f = (y[i - 1] - target) / (y[i - 1] - y[i])  # y[i-1] > target >= y[i]
            return float(t[i - 1] + f * (t[i] - t[i - 1])), "interpolated"
    return None, "not_reached"


def compute_saved(tokens: Sequence[float], ref_bpb: Sequence[float], arm_bpb: Sequence[float]) -> list[dict[str, Any]]:
    """At each budget of ``arm_bpb``'s curve: the tokens the reference (``scratch``) curve needs to reach the arm's
    bpb there, and the extra fraction of tokens that is (both curves measured at the same ``tokens``)."""
    out = []
    for b, target in zip(tokens, arm_bpb):
        need, status = tokens_to_reach(tokens, ref_bpb, float(target))
        extra = None if need is None else (need - float(b)) / float(b)
        out.append({"budget": float(b), "target_bpb": float(target), "ref_tokens_needed": need, "status": status,
                    "extra_fraction": extra,
                    # not reached within the run: scratch needs more than all of it — a lower bound on the saving
                    "extra_fraction_at_least": (float(tokens[-1]) - float(b)) / float(b) if need is None else None})
    return out


def crossover(tokens: Sequence[float], ref_bpb: Sequence[float], other_bpb: Sequence[float]) -> float | None:
    """First budget at which ``ref`` (scratch) is at or below ``other`` after being above it (interpolated);
    ``tokens[0]`` if it is never above; None if it never gets there within the run."""
    t = np.asarray(tokens, dtype=float)
    d = np.asarray(ref_bpb, dtype=float) - np.asarray(other_bpb, dtype=float)
    if d[0] <= 0:
        return float(t[0])
    for i in range(1, t.size):
        if d[i] <= 0:
            f = d[i - 1] / (d[i - 1] - d[i])
            return float(t[i - 1] + f * (t[i] - t[i - 1]))
    return None


def paired(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Per-seed differences ``a - b`` (same seed): values, mean, sample std, min, max, and how many are < 0
    (``a`` better, lower bpb)."""
    x = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if x.size == 0 or len(a) != len(b):
        raise PolymemError(f"paired comparison needs the same non-zero number of seeds on both sides ({len(a)} vs {len(b)})")
    return {"diff": x.tolist(), "mean": float(x.mean()), "std": float(x.std(ddof=1)) if x.size > 1 else None,
            "min": float(x.min()), "max": float(x.max()), "n": int(x.size), "a_better": int((x < 0).sum())}



def end_of_schedule_saving(target_bpb: Sequence[float], budget: float,
                           scratch_runs: Sequence[tuple[float, Sequence[float]]]) -> dict[str, Any]:
    """Compute saved at one budget, measured against *complete* scratch runs of several lengths.

    ``target_bpb``: an arm's final bpb per seed at ``budget`` tokens (after its learning-rate decay).
    ``scratch_runs``: ``(tokens, final bpb per seed)`` of scratch runs with the same seeds, each with its own full
    schedule, so every point is post-decay like the target (unlike the intermediate points of one run). Per seed:
    the tokens scratch needs to reach the target, interpolated between the run lengths around the crossing
    (:func:`tokens_to_reach` over the end-of-schedule points), and the extra fraction ``(need - budget) / budget``;
    ``None`` with ``extra_fraction_at_least`` when even the longest run does not get there."""
    runs = sorted((float(t), [float(v) for v in b]) for t, b in scratch_runs)
    if not runs:
        raise PolymemError("end_of_schedule_saving needs at least one scratch run")
    n = len(target_bpb)
    if any(len(b) != n for _, b in runs):
        raise PolymemError(f"every scratch run needs one final bpb per seed ({n}); got {[len(b) for _, b in runs]}")
    tokens = [t for t, _ in runs]
    per_seed: list[dict[str, Any]] = []
    for i, target in enumerate(target_bpb):
        need, status = tokens_to_reach(tokens, [b[i] for _, b in runs], float(target))
        per_seed.append({"target_bpb": float(target), "ref_tokens_needed": need, "status": status,
                         "extra_fraction": None if need is None else (need - float(budget)) / float(budget),
                         "extra_fraction_at_least": (tokens[-1] - float(budget)) / float(budget) if need is None else None})
    extras = [p["extra_fraction"] for p in per_seed]
    return {"budget": float(budget), "scratch_run_tokens": tokens, "per_seed": per_seed,
            "extra_fraction_mean": float(np.mean(extras)) if all(e is not None for e in extras) else None,
            "definition": "tokens a complete scratch run needs to reach the arm's final bpb at the budget, "
                          "interpolated between scratch runs of several lengths (all post-decay)"}


PAIRS = (("donor_finetune", "scratch"), ("donor", "scratch"), ("donor_finetune", "donor"), ("donor", "random"),
         ("random", "none"), ("donor", "none"), ("donor_memory_off", "none"))


def analyze(result: dict[str, Any]) -> dict[str, Any]:
    """From a result with ``curves``: paired comparisons (final budget and per curve point), compute saved by
    donor_finetune and donor against scratch at every budget (per seed and on the seed mean), the crossover of
    scratch over the frozen donor, and the issue's targets."""
    curves = result.get("curves") or {}
    arms = result["arms"]
    out: dict[str, Any] = {"paired_final": {}, "paired_curve": {}, "compute_saved": {}, "crossover_scratch_over_donor": None}
    for a, b in PAIRS:
        if a in arms and b in arms:
            out["paired_final"][f"{a}-{b}"] = paired(arms[a]["bpb"], arms[b]["bpb"])
            if a in curves and b in curves:
                out["paired_curve"][f"{a}-{b}"] = [
                    paired([s[j] for s in curves[a]["bpb"]], [s[j] for s in curves[b]["bpb"]])
                    for j in range(len(curves[a]["tokens"]))]
    if "scratch" in curves:
        t = curves["scratch"]["tokens"]
        ref = curves["scratch"]["bpb"]
        for arm in ("donor_finetune", "donor", "random", "none"):
            if arm not in curves:
                continue
            per_seed = [compute_saved(t, r, y) for r, y in zip(ref, curves[arm]["bpb"])]
            mean = compute_saved(t, np.mean(ref, axis=0), np.mean(curves[arm]["bpb"], axis=0))
            out["compute_saved"][arm] = {"per_seed": per_seed, "seed_mean_curves": mean}
        if "donor" in curves:
            per = [crossover(t, r, d) for r, d in zip(ref, curves["donor"]["bpb"])]
            out["crossover_scratch_over_donor"] = {
                "per_seed": per, "seed_mean_curves": crossover(t, np.mean(ref, axis=0), np.mean(curves["donor"]["bpb"], axis=0)),
                "definition": "recipient tokens at which scratch first reaches the frozen donor arm's bpb (None: not within the run)"}
    out["targets"] = _targets(result, out)
    return out


def _targets(result: dict[str, Any], an: dict[str, Any]) -> dict[str, Any]:
    curves = result.get("curves") or {}
    t: dict[str, Any] = {}

    def all_points(a: str, b: str) -> bool | None:  # a < b (strictly), every point, every seed
        if a not in curves or b not in curves:
            return None
        return bool(all(x < y for sa, sb in zip(curves[a]["bpb"], curves[b]["bpb"]) for x, y in zip(sa, sb)))

    if "donor_finetune" in curves and "scratch" in curves:
        t["donor_finetune_le_scratch_every_budget_every_seed"] = bool(all(
            x <= y for sa, sb in zip(curves["donor_finetune"]["bpb"], curves["scratch"]["bpb"]) for x, y in zip(sa, sb)))
    if all(k in curves for k in ("donor", "random", "none")):
        t["donor_lt_random_lt_none_every_budget_every_seed"] = bool(all_points("donor", "random") and all_points("random", "none"))
        t["donor_lt_random_every_budget_every_seed"] = all_points("donor", "random")
        t["random_lt_none_every_budget_every_seed"] = all_points("random", "none")
    cs = an["compute_saved"].get("donor_finetune")
    if cs:
        last = cs["seed_mean_curves"][-1]
        per = [s[-1] for s in cs["per_seed"]]
        t["compute_saved_at_final_budget"] = {
            "seed_mean_curves": last["extra_fraction"], "at_least": last["extra_fraction_at_least"],
            "per_seed": [p["extra_fraction"] for p in per], "per_seed_at_least": [p["extra_fraction_at_least"] for p in per],
            "moonshot_30pct": (last["extra_fraction"] is not None and last["extra_fraction"] >= 0.3)
            or (last["extra_fraction_at_least"] is not None and last["extra_fraction_at_least"] >= 0.3)}
    return t


def markdown_report(result: dict[str, Any]) -> str:
    """Markdown tables of a curves result: final bpb per seed, mean curves, compute saved, crossover, paired stats
    (what docs/transfer.md quotes)."""
    an = result.get("analysis") or analyze(result)
    seeds = result["seeds"]
    lines = [f"Final budget ({result['tokens']:,} recipient tokens), held-out bits/byte:", "",
             "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |", "|---|" + "---|" * (len(seeds) + 1)]
    for arm, v in result["arms"].items():
        lines.append(f"| {arm} | " + " | ".join(f"{x:.4f}" for x in v["bpb"]) + f" | {np.mean(v['bpb']):.4f} |")
    curves = result.get("curves") or {}
    if curves:
        t = next(iter(curves.values()))["tokens"]
        lines += ["", "Mean over seeds at each point (recipient tokens):", "",
                  "| arm | " + " | ".join(f"{x / 1000:.0f}k" for x in t) + " |", "|---|" + "---|" * len(t)]
        for arm, c in curves.items():
            lines.append(f"| {arm} | " + " | ".join(f"{x:.3f}" for x in np.mean(c["bpb"], axis=0)) + " |")
    for arm, cs in an.get("compute_saved", {}).items():
        if arm not in ("donor_finetune", "donor"):
            continue
        lines += ["", f"Tokens scratch needs to reach `{arm}` (seed-mean curves; extra = scratch needs that much more):", "",
                  "| budget | " + arm + " bpb | scratch needs | extra |", "|---|---|---|---|"]
        for p in cs["seed_mean_curves"]:
            need = "not within the run" if p["ref_tokens_needed"] is None else f"{p['ref_tokens_needed'] / 1000:.1f}k"
            if p["status"] == "at_or_before":
                need = f"≤ {need}"
            extra = (f"{p['extra_fraction']:+.0%}" if p["extra_fraction"] is not None
                     else f"≥ {p['extra_fraction_at_least']:+.0%}")
            lines.append(f"| {p['budget'] / 1000:.0f}k | {p['target_bpb']:.3f} | {need} | {extra} |")
    xo = an.get("crossover_scratch_over_donor")
    if xo:
        f = lambda v: "not within the run" if v is None else f"{v / 1000:.1f}k"  # noqa: E731
        lines += ["", f"Scratch reaches the frozen donor at: {f(xo['seed_mean_curves'])} tokens (seed-mean curves); "
                      f"per seed: {', '.join(f(v) for v in xo['per_seed'])}."]
    if an.get("paired_final"):
        lines += ["", "Paired per seed at the final budget (a − b, negative = a better):", "",
                  "| a − b | per seed | mean | std | a better |", "|---|---|---|---|---|"]
        for pair, p in an["paired_final"].items():
            std = "–" if p["std"] is None else f"{p['std']:.4f}"
            lines.append(f"| {pair.replace('-', ' − ')} | {', '.join(f'{x:+.4f}' for x in p['diff'])} | {p['mean']:+.4f} | "
                         f"{std} | {p['a_better']}/{p['n']} |")
    return "\n".join(lines) + "\n"
