"""The end of `polymem transfer` (recipients trained from scratch), for a reader: paired differences as a table,
the compute a donor saves and when scratch catches up in words, the targets as yes/no, and one verdict line.

    paired differences of held-out bits/byte (first arm − second, same seed; below 0: the first arm is better)
    ┃ first − second           ┃    mean ┃    std ┃     min ┃     max ┃ first better on ┃
    │ donor − none             │ -0.2618 │ 0.0473 │ -0.3013 │ -0.2094 │       3/3 seeds │
    compute saved at 102,400 recipient tokens (seed-mean curves; the tokens scratch needs to reach each arm's …):
      donor: scratch reaches its 2.1104 bits/byte with 15% fewer tokens (87,371): donor saved nothing
    scratch caught up with the frozen donor at 21,252 tokens (per seed: 10,240, 24,559, 22,605)
    verdict: the frozen donor table lowers held-out bits/byte against no memory: -0.2618 (-11.04%), better on 3/3
    seeds; at 102,400 tokens scratch did not reach donor_finetune within the run

Every figure is in the JSON unrounded (docs/transfer.md says what each means); nothing here computes a new one.
What this module does not do: the tables of `--model` recipients (polymem/cli/_transfer_model.py).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape


def print_analysis(result: dict[str, Any], console: Console) -> None:
    an = result["analysis"]
    _paired(an["paired_final"], console)
    _compute_saved(an["compute_saved"], console)
    _crossover(an.get("crossover_scratch_over_donor"), result, console)
    _targets(an["targets"], console)
    cov = result["coverage"].get("trained_hashes")
    if cov:
        console.print("share of the recipient's held-out n-grams whose hash the donor trained: "
                      + ", ".join(f"n={n} {v:.0%}" for n, v in cov["per_n"].items()), highlight=False)
    console.print(_verdict(result), highlight=False)


def _paired(pairs: dict[str, Any], console: Console) -> None:
    n = max((p["n"] for p in pairs.values()), default=0)
    t = Table(title="paired differences of held-out bits/byte (first arm − second, same seed; below 0: the first "
                    "arm is better)", title_justify="left")
    t.add_column("first − second")
    if n > 1:
        for col in ("mean", "std", "min", "max"):
            t.add_column(col, justify="right")
    else:
        t.add_column("difference (1 seed)", justify="right")
    t.add_column("first better on", justify="right")
    for name, p in pairs.items():
        spread = [f"{p['std']:.4f}", f"{p['min']:+.4f}", f"{p['max']:+.4f}"] if n > 1 else []
        t.add_row(escape(name.replace("-", " − ")), f"{p['mean']:+.4f}", *spread, f"{p['a_better']}/{p['n']} seeds")
    console.print(t)


def _compute_saved(saved: dict[str, Any], console: Console) -> None:
    if not saved:
        return
    budget = next(iter(saved.values()))["seed_mean_curves"][-1]["budget"]
    console.print(f"compute saved at {budget:,.0f} recipient tokens (seed-mean curves; the tokens scratch needs to "
                  "reach each arm's bits/byte):", highlight=False)
    for arm, cs in saved.items():
        console.print(f"  {escape(arm)}: {_saved_words(arm, cs['seed_mean_curves'])}", highlight=False)


def _saved_words(arm: str, points: list[dict[str, Any]]) -> str:
    last = points[-1]
    need, extra = last["ref_tokens_needed"], last["extra_fraction"]
    if extra is None:
        earlier = [p for p in points[:-1] if p["extra_fraction"] is not None]
        then = (f"; at {earlier[-1]['budget']:,.0f} tokens it needed {earlier[-1]['extra_fraction']:+.0%}"
                if earlier else "")
        return (f"scratch never reached its {last['target_bpb']:.4f} bits/byte within the run: {arm} saved more "
                f"than this run can measure{then}")
    if extra >= 0:
        return (f"scratch needs {extra:.0%} more tokens ({need:,.0f}) to reach its {last['target_bpb']:.4f} "
                f"bits/byte: {arm} saved {extra / (1 + extra):.0%} of recipient tokens")
    sooner = "or fewer " if last["status"] == "at_or_before" else ""
    return (f"scratch reaches its {last['target_bpb']:.4f} bits/byte with {-extra:.0%} {sooner}fewer tokens "
            f"({need:,.0f}): {arm} saved nothing")


def _crossover(xo: dict[str, Any] | None, result: dict[str, Any], console: Console) -> None:
    if not xo:
        return
    per = ", ".join("not within the run" if x is None else f"{x:,.0f}" for x in xo["per_seed"])
    at = xo["seed_mean_curves"]
    console.print(f"scratch caught up with the frozen donor at {at:,.0f} tokens (per seed: {per})" if at is not None
                  else f"scratch did not catch up with the frozen donor within the run ({result['tokens']:,} tokens; "
                       f"per seed: {per})", highlight=False)


def _target_name(key: str) -> str:
    """'donor_lt_random_every_budget_every_seed' -> 'donor < random at every budget, on every seed'."""
    return (key.replace("_every_budget_every_seed", " at every budget, on every seed")
            .replace("_lt_", " < ").replace("_le_", " ≤ "))


def _targets(targets: dict[str, Any], console: Console) -> None:
    lines = []
    for key, value in targets.items():
        if isinstance(value, dict):  # compute saved at the final budget: the words above; here its 30 % bar
            key, value = "donor_finetune saved ≥ 30 % of recipient tokens at the final budget", value["moonshot_30pct"]
        lines.append(f"  {'yes' if value else 'no ':3}  {escape(_target_name(key))}")
    if lines:
        console.print("targets (held-out bits/byte, lower is better):\n" + "\n".join(lines), highlight=False)


def _verdict(result: dict[str, Any]) -> str:
    pairs = result["analysis"]["paired_final"]
    p = pairs.get("donor-none")
    if p is None:
        return "verdict: add the none arm (--arms …,none) to compare the donor table with no memory"
    base = sum(result["arms"]["none"]["bpb"]) / len(result["arms"]["none"]["bpb"])
    how = "lowers" if p["mean"] < 0 else "does not lower"
    return (f"verdict: the frozen donor table {how} held-out bits/byte against no memory: {p['mean']:+.4f} "
            f"({p['mean'] / base:+.2%}), better on {p['a_better']}/{p['n']} seeds{_saved_verdict(result)}")


def _saved_verdict(result: dict[str, Any]) -> str:
    """'; donor_finetune saved 6% of recipient tokens at 102,400 tokens' (or why it saved nothing), from the
    fine-tuned donor's (else the frozen donor's) seed-mean curve."""
    saved = result["analysis"]["compute_saved"]
    arm = next((a for a in ("donor_finetune", "donor") if a in saved), None)
    if arm is None:
        return ""
    last = saved[arm]["seed_mean_curves"][-1]
    b, extra = f"{last['budget']:,.0f}", last["extra_fraction"]
    if extra is None:
        return f"; at {b} tokens scratch did not reach {arm} within the run"
    if extra < 0:
        return f"; scratch caught up with {arm} before {b} tokens"
    return f"; {arm} saved {extra / (1 + extra):.0%} of recipient tokens at {b} tokens"
