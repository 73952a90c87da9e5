"""The scores of a needle-in-a-haystack grid (arXiv 2406.16690's NIAH), from its per-cell accuracies.

``acc[j][i]`` is the accuracy of the cell at the j-th depth and the i-th context length (both in increasing order),
each the mean over that cell's trials of a 0/1 verdict (or a fractional credit for a tie under choice scoring).

- **Per-cell accuracy**: ``acc`` itself (the heatmap).
- **Accuracy at or below each length**: for the i-th length L_i, the mean of every cell whose length is at most
  L_i, ``cum_i = sum_{j, k <= i} acc[j][k] / (n_depths (i + 1))``. The paper's NIAH tables report the accuracy
  over the lengths up to a bound in this way; ``cum`` gives it for every length of the grid, so a reader takes
  the bound (4K, 8K, 16K) a table needs.
- **Weighted average**: ``sum_ij w_ij acc[j][i] / sum_ij w_ij`` with the geometric weights of
  :func:`cell_weights`. The paper weights long contexts and deep needles more and publishes no constants; linlm's
  choice is ``length_ratio`` = 4 (the longest length weighs 4 x the shortest) and ``depth_ratio`` = 2 (the
  deepest needle 2 x the shallowest), each growing geometrically along its axis.
- **Score (with the penalty)**: the weighted average over the *whole requested grid*, in which a cell the model
  could not take (a length beyond a position-limited model's max_seq_len, or one too short for the needle and the
  question) counts as a miss (accuracy 0) instead of being left out. The weighted average alone rewards a model
  for the lengths it skips: a LLaMA trained at 8K and scored only up to 8K would be compared on an easier grid
  than a linear model scored to 16K. The paper names a penalty without publishing its form; this one, the
  zero-credit cell, is linlm's choice. On a grid with nothing skipped the score equals the weighted average.
"""

from __future__ import annotations

from typing import Sequence


def cell_weights_for(lengths: Sequence, depths: Sequence, length_ratio: float, depth_ratio: float) -> list[list[float]]:
    """w[j][i] = length_ratio ** (i / (n_lengths - 1)) * depth_ratio ** (j / (n_depths - 1)), for depth j and
    length i (an axis of one point weighs 1)."""
    nl, nd = len(lengths), len(depths)
    wl = [length_ratio ** (i / (nl - 1)) if nl > 1 else 1.0 for i in range(nl)]
    wd = [depth_ratio ** (j / (nd - 1)) if nd > 1 else 1.0 for j in range(nd)]
    return [[wd[j] * wl[i] for i in range(nl)] for j in range(nd)]


def cell_weights(cfg) -> list[list[float]]:
    """w[j][i] for depth j and length i of a NIAHConfig's grid (see the module doc)."""
    return cell_weights_for(cfg.lengths, cfg.depths, cfg.length_ratio, cfg.depth_ratio)


def weighted_average(acc: list[list[float]], weights: list[list[float]]) -> float:
    total = sum(sum(r) for r in weights)
    return sum(w * a for wr, ar in zip(weights, acc) for w, a in zip(wr, ar)) / total


def cumulative_accuracy(acc: list[list[float]]) -> list[float]:
    """cum[i]: the mean accuracy over every cell of length index <= i (every depth)."""
    out, running = [], 0.0
    n_depths = len(acc)
    for i in range(len(acc[0]) if acc else 0):
        running += sum(row[i] for row in acc)
        out.append(running / (n_depths * (i + 1)))
    return out


def penalized_score(acc: list[list[float]], kept: Sequence[int], requested: Sequence[int], depths: Sequence,
                    length_ratio: float, depth_ratio: float) -> float:
    """The weighted average over the requested lengths, the cells of a length not in ``kept`` scored 0."""
    requested = sorted(set(int(x) for x in requested))
    col = {L: i for i, L in enumerate(kept)}
    full = [[row[col[L]] if L in col else 0.0 for L in requested] for row in acc]
    return weighted_average(full, cell_weights_for(requested, depths, length_ratio, depth_ratio))


def accuracy_up_to(result: dict, bound: int) -> float | None:
    """The accuracy over the cells of length <= ``bound`` in a result of ``run_niah`` (None when no length is)."""
    idx = [i for i, L in enumerate(result["lengths"]) if L <= bound]
    return result["cumulative"][idx[-1]] if idx else None


def summary_bounds(lengths: Sequence[int], n: int = 4) -> list[int]:
    """Up to ``n`` lengths of the grid at which to read the accumulated accuracy: for k = 1..n, the longest length
    at or below k/n of the longest (on the paper's grid, the last lengths within 4K, 8K, 12K and 16K)."""
    if not lengths:
        return []
    hi = lengths[-1]
    picks = []
    for k in range(1, n + 1):
        target = hi * k / n
        best = max((L for L in lengths if L <= target), default=lengths[0])
        if best not in picks:
            picks.append(best)
    return picks


def accuracy_at_bounds(result: dict, n: int = 4) -> dict[int, float]:
    """{bound: accuracy over the cells of length <= bound} at :func:`summary_bounds` of the result's lengths."""
    return {b: accuracy_up_to(result, b) for b in summary_bounds(result["lengths"], n)}
