"""What a transfer run says: paired comparisons of its arms with intervals and one plain line each, and the
record of one direction for docs/results/transfer-pays.json.

Not here: the runs (:mod:`polymem.recipes.pretrained`), the interval arithmetic (:mod:`polymem.recipes.stats`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def paired_margins(arms: Sequence[str], res: dict[str, Any]) -> dict[str, Any]:
    """Per-seed margins of the donor over each control (final scores) and of in_place over donor_finetune along
    the curve (kept for readers of older results; :func:`compare_arms` gives the intervals and verdicts)."""
    paired: dict[str, Any] = {}
    sets = list(res["arms"][arms[0]]["bpb"]) if arms else []
    if "donor" in arms:
        for ctl in ("random", "null", "none"):
            if ctl in arms:
                paired[f"donor_vs_{ctl}"] = {k: {"margin_bpb": [c - d for c, d in zip(res["arms"][ctl]["bpb"][k], res["arms"]["donor"]["bpb"][k])]}
                                             for k in sets}
    if "donor_finetune" in arms and "in_place" in arms:
        ft, ip = res["curves"]["donor_finetune"]["bpb"], res["curves"]["in_place"]["bpb"]
        paired["donor_finetune_vs_in_place"] = {
            "tokens": res["curves"]["in_place"]["tokens"],
            "margin_bpb": [[b - a for a, b in zip(fs, ips)] for fs, ips in zip(ft, ip)],  # [seed][budget] in_place - finetune
            "finetune_at_most_in_place_everywhere": bool(all(a <= b for fs, ips in zip(ft, ip) for a, b in zip(fs, ips)))}
    return paired


def _bits(runs: dict[tuple[str, int], dict[str, Any]], arm: str, seeds: Sequence[int], where: str | int
          ) -> tuple[list[list[float]], list[int]]:
    """[seeds][documents] bits of ``arm`` at curve point ``where`` (an index) or on scoring set ``where`` (final)."""
    rows, nbytes = [], []
    for s in seeds:
        r = runs[(arm, s)]
        d = r["curve_docs"][where] if isinstance(where, int) else r["docs"][where]
        rows.append(d["bits"])
        nbytes = d["bytes"]
    return rows, nbytes


def compare_arms(arms: Sequence[str], seeds: Sequence[int], runs: dict[tuple[str, int], dict[str, Any]],
                 in_domain: str, sets: Sequence[str]) -> list[dict[str, Any]]:
    """The comparisons a reader asks for, each with per-seed paired 95 % intervals over documents and one plain
    line: the donor against training in place at every budget (with the recipient tokens it saved), the donor
    against each control at the largest budget, donor_finetune against in_place, and out of domain every
    memory arm against the model alone. A verdict only where every seed's interval excludes zero."""
    from polymem.recipes.stats import paired_bootstrap, tokens_to_match

    out: list[dict[str, Any]] = []
    if not runs or not arms:
        return out
    r0 = runs[(arms[0], seeds[0])]
    tokens = list(r0["curve_tokens"])

    def cmp(a: str, b: str, where: str | int) -> dict[str, Any]:
        ba, nb = _bits(runs, a, seeds, where)
        bb, _ = _bits(runs, b, seeds, where)
        return paired_bootstrap(ba, bb, nb)

    def mean_curve(arm: str) -> list[float]:
        return [float(np.mean([runs[(arm, s)]["curve_bpb"][i] for s in seeds])) for i in range(len(tokens))]

    if "donor" in arms and "in_place" in arms:
        ip = mean_curve("in_place")
        dn = mean_curve("donor")
        for i, t in enumerate(tokens):
            if t == 0 and dn[0] == ip[0]:
                continue  # both are the model alone at step 0
            c = cmp("donor", "in_place", i)
            need = tokens_to_match(tokens, ip, dn[i])
            saved = None if need is None else need - t
            if c["verdict"] == "a_lower":
                more = (f"~{saved:,.0f}" if saved is not None else f"more than {tokens[-1] - t:,}")
                line = (f"at {t:,} recipient tokens the donor is ahead of training in place on every seed "
                        f"({c['mean']:+.4f} bits/byte): it saved {more} recipient tokens")
            elif c["verdict"] == "a_higher":
                line = (f"at {t:,} recipient tokens training in place is ahead of the donor on every seed "
                        f"({c['mean']:+.4f} bits/byte for the donor): no tokens saved")
            else:
                line = f"at {t:,} recipient tokens donor vs training in place: within noise ({c['mean']:+.4f} bits/byte)"
            out.append({"name": "donor_vs_in_place", "tokens": t, "set": in_domain, **c,
                        "in_place_tokens_to_match": need, "tokens_saved": saved, "line": line})
    last = len(tokens) - 1
    if "donor" in arms:
        for ctl in ("random", "null", "none"):
            if ctl not in arms:
                continue
            c = cmp("donor", ctl, last)
            word = {"a_lower": "the donor is better on every seed", "a_higher": f"{ctl} is better on every seed",
                    "within_noise": "within noise"}[c["verdict"]]
            out.append({"name": f"donor_vs_{ctl}", "tokens": tokens[last], "set": in_domain, **c,
                        "line": f"donor vs {ctl} at {tokens[last]:,} tokens on {in_domain}: {word} ({c['mean']:+.4f} bits/byte)"})
    if "donor_finetune" in arms and "in_place" in arms:
        for i, t in enumerate(tokens):
            if t == 0:
                continue
            c = cmp("donor_finetune", "in_place", i)
            word = {"a_lower": "donor_finetune ahead on every seed", "a_higher": "in_place ahead on every seed",
                    "within_noise": "within noise"}[c["verdict"]]
            out.append({"name": "donor_finetune_vs_in_place", "tokens": t, "set": in_domain, **c,
                        "line": f"at {t:,} tokens donor_finetune vs in_place: {word} ({c['mean']:+.4f} bits/byte)"})
    if "none" in arms:
        for k in sets:
            if k == in_domain:
                continue
            for arm in arms:
                if arm == "none":
                    continue
                c = cmp(arm, "none", k)
                base = float(np.sum(_bits(runs, "none", seeds[:1], k)[0][0]) / max(np.sum(_bits(runs, "none", seeds[:1], k)[1]), 1))
                rel = c["mean"] / base if base else 0.0
                word = {"a_higher": "the table hurts there", "a_lower": "the table helps there",
                        "within_noise": "within noise"}[c["verdict"]]
                out.append({"name": f"{arm}_vs_none", "tokens": tokens[last], "set": k, **c, "relative": rel,
                            "line": f"out of domain: {arm} {rel:+.2%} on {k} against the model alone — {word}"})
    return out


def direction_record(summary: dict[str, Any]) -> dict[str, Any]:
    """One direction of docs/results/transfer-pays.json: curves and out-of-domain scores per arm and seed."""
    ind = summary["in_domain"]
    arms: dict[str, Any] = {}
    for arm, c in summary["curves"].items():
        arms[arm] = {"curve": {str(t): [float(b[i]) for b in c["bpb"]] for i, t in enumerate(c["tokens"])},
                     "ood": {k: list(v) for k, v in summary["arms"][arm]["bpb"].items() if k != ind}}
    return {"donor": summary["donor_model"], "recipient": summary["recipient_model"],
            "donor_tokens": summary["donor"].get("tokens_seen"), "in_domain": ind,
            "ood": [k for k in summary["base_bpb"] if k != ind], "seeds": summary["seeds"],
            "budgets": [int(t) for t in next(iter(summary["curves"].values()))["tokens"]], "arms": arms,
            "init": summary.get("init"), "gate": summary.get("gate"), "alignment": summary.get("alignment"),
            "verdicts": summary.get("verdicts", []), "comparisons": summary.get("comparisons", [])}
