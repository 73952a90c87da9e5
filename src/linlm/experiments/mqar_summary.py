"""What the MQAR experiment's runs add up to: each configuration over its seeds, whether training had converged,
and the comparison groups (equal active parameters, equal state size), all from the runs' measured rows.

- A configuration's accuracy is the mean over its seeds, with the min-max spread (and the sample standard
  deviation, 0 for one seed).
- Convergence (:func:`loss_trend`): the mean training loss of the last tenth of the steps against the tenth before
  it; a run whose loss fell by more than ``FALLING`` (relative) between the two is still falling.
- Groups, per width d: "equal active parameters" holds every configuration within ``ACTIVE_TOL`` (relative) of the
  one-expert MossNet's active non-embedding parameters; "equal state size" (one group per E) every configuration
  whose state per layer (the decoding state's floats over the layer count) is within ``STATE_TOL`` of MossNet-E's.
"""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

FALLING = 0.02  # relative drop of the windowed training loss above which a run has not converged
ACTIVE_TOL = 0.10  # active parameters within 10 % of the reference count as equal
STATE_TOL = 0.02  # states per layer within 2 % count as equal


def loss_trend(losses: Sequence[Optional[float]]) -> dict:
    """The mean loss of the last window (a tenth of the steps, at least one) and of the window before it, and
    whether the loss was still falling (None with fewer than two windows' worth of losses)."""
    xs = [x for x in losses if x is not None]
    w = max(1, len(xs) // 10)
    if len(xs) < 2 * w or not xs:
        return {"loss_last_window": None, "loss_prev_window": None, "still_falling": None}
    last, prev = statistics.fmean(xs[-w:]), statistics.fmean(xs[-2 * w:-w])
    return {"loss_last_window": last, "loss_prev_window": prev, "still_falling": prev - last > FALLING * abs(prev)}


def mossnet_setting(row: dict) -> tuple[Optional[int], Optional[str]]:
    """(E, policy as written: routed-kN, dense or dense-kN) of a MossNet row; (None, None) for other models."""
    if row["arch"] != "mossnet":
        return None, None
    over = row.get("overrides") or {}
    e, k, policy = over.get("ssm_experts", 1), over.get("ssm_top_k", 1), over.get("ssm_policy", "routed")
    return e, (f"routed-k{k}" if policy == "routed" else ("dense" if k == e else f"dense-k{k}"))


def _mean(rows: list[dict], key: str) -> Optional[float]:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(xs) if xs else None


def summarize(rows: list[dict]) -> list[dict]:
    """One row per configuration (the runs' ``name``), in the order of its first run: the sizes, the seeds, how many
    of them diverged, the accuracy's mean, min, max and standard deviation over the seeds that did not (None where
    none is left), and the means of the other measures."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["name"], []).append(r)
    out = []
    for name, runs in by.items():
        first, acc = runs[0], [r["accuracy"] for r in runs if r.get("accuracy") is not None]
        experts, policy = mossnet_setting(first)
        falling = [r.get("still_falling") for r in runs]
        out.append({
            "name": name, "arch": first["arch"], "d_model": first["d_model"], "n_layers": first["n_layers"],
            "experts": experts, "policy": policy, "params": first["params"], "active_params": first["active_params"],
            "state_floats": first["state_floats"],
            "state_per_layer": first.get("state_per_layer", first["state_floats"] / first["n_layers"]),
            "seeds": [r.get("seed", 0) for r in runs], "diverged": sum(bool(r.get("diverged")) for r in runs),
            "accuracy": statistics.fmean(acc) if acc else None, "accuracy_min": min(acc, default=None),
            "accuracy_max": max(acc, default=None),
            "accuracy_std": (statistics.stdev(acc) if len(acc) > 1 else 0.0) if acc else None,
            "sequence_accuracy": _mean(runs, "sequence_accuracy"), "final_loss": _mean(runs, "final_loss"),
            "loss_last_window": _mean(runs, "loss_last_window"), "loss_prev_window": _mean(runs, "loss_prev_window"),
            "still_falling": sum(bool(f) for f in falling) if any(f is not None for f in falling) else None,
            "steps": first["steps"], "seconds": sum(r.get("seconds") or 0.0 for r in runs)})
    return out


def _member(c: dict, ref: float, key: str) -> dict:
    return {"name": c["name"], "arch": c["arch"], "experts": c["experts"], "policy": c["policy"],
            "active_params": c["active_params"], "state_per_layer": c["state_per_layer"], "ratio": c[key] / ref,
            "accuracy": c["accuracy"], "accuracy_min": c["accuracy_min"], "accuracy_max": c["accuracy_max"],
            "seeds": len(c["seeds"]), "diverged": c["diverged"], "still_falling": c["still_falling"]}


def _group(kind: str, key: str, tol: float, ref: dict, pool: list[dict], **extra) -> dict:
    members = [_member(c, ref[key], key) for c in pool if abs(c[key] / ref[key] - 1) <= tol]
    return {"kind": kind, "d_model": ref["d_model"], **extra, "reference": ref["name"], "measure": key,
            "tolerance": tol, "members": members}


def comparison_groups(configs: list[dict]) -> list[dict]:
    """The groups of the module doc, width by width: equal active parameters (reference: the one-expert MossNet),
    then equal state size for each E (reference: MossNet-E's first configuration)."""
    groups = []
    for d in dict.fromkeys(c["d_model"] for c in configs):
        pool = [c for c in configs if c["d_model"] == d]
        moss = [c for c in pool if c["experts"] is not None]
        one = next((c for c in moss if c["experts"] == 1), None)
        if one is not None:
            groups.append(_group("equal active params", "active_params", ACTIVE_TOL, one, pool))
        for e in dict.fromkeys(c["experts"] for c in moss):
            ref = next(c for c in moss if c["experts"] == e)
            groups.append(_group("equal state size", "state_per_layer", STATE_TOL, ref, pool, experts=e))
    return groups


def _num(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _spread(c: dict) -> str:
    return "-" if c["accuracy_min"] is None else f"{c['accuracy_min']:.3f}-{c['accuracy_max']:.3f}"


def config_table(configs: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the configurations: sizes, seeds, the accuracy's mean and min-max, and convergence (the
    last window's training loss, and on how many seeds it was still falling)."""
    headers = ["model", "d", "layers", "active params", "state/layer", "seeds", "diverged", "accuracy (mean)",
               "min-max", "train loss (last window)", "still falling"]
    rows = [[c["name"], str(c["d_model"]), str(c["n_layers"]), f"{c['active_params']:,}",
             f"{c['state_per_layer']:,.0f}", str(len(c["seeds"])), str(c.get("diverged", 0)),
             _num(c["accuracy"], ".3f"), _spread(c), _num(c["loss_last_window"], ".3f"),
             "-" if c["still_falling"] is None else f"{c['still_falling']} of {len(c['seeds'])}"] for c in configs]
    return headers, rows


def group_table(groups: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the comparison groups, one row per member: its measure over the reference's."""
    headers = ["group", "d", "reference", "model", "ratio to reference", "accuracy (mean)", "min-max"]
    rows = [[g["kind"] + (f", E={g['experts']}" if "experts" in g else ""), str(g["d_model"]), g["reference"],
             m["name"], f"{m['ratio']:.3f}", _num(m["accuracy"], ".3f"), _spread(m)]
            for g in groups for m in g["members"]]
    return headers, rows
