"""Scaling-law fits: the compute-optimal envelope, power laws in log space, Chinchilla's parametric law,
IsoFLOP profiles, bootstrap intervals, and the compute at which two fitted laws cross.

Units. Compute ``C`` is in FLOPs inside this module (the library's counters: training FLOPs per token x tokens);
the report and the paper's coefficients use PFLOP/s-days, ``C / PFLOPS_DAY``. ``N`` is non-embedding
parameters (active ones for mixtures of experts), ``D`` training tokens.

The paper's method (arXiv 2406.16690, as Chinchilla approach 1): every run logs its training loss at fixed
token intervals; for each compute value the envelope takes the lowest loss over all runs of an architecture
(each run's curve interpolated linearly in log C), remembers which run gave it (its N) and how many tokens that
run had seen at that compute (D). Then ``L = beta C^alpha``, ``N_opt = beta C^alpha`` and ``D_opt = beta
C^alpha`` are each a straight line in log-log space, fitted by least squares. The paper has no irreducible term.

Chinchilla's ``L(N, D) = E + A / N^a + B / D^b`` is fitted as Hoffmann et al. (2022) do: in log space,
``log L_hat = logsumexp(log A - a log N, log B - b log D, log E)``, with a Huber loss (delta 1e-3) on
``log L_hat - log L``, minimised by L-BFGS (scipy) from the best points of a grid of starts.

Approach 2 (IsoFLOP): at each of several compute levels, every run that reaches it contributes its
(interpolated) loss; a parabola in log N through those points has its minimum at N_opt(C). With one learning
rate schedule per run this reads intermediate points of a run, not a run tuned to end at C (see docs/scaling.md).

Intervals: a nonparametric bootstrap (points resampled with replacement, the fit repeated), percentile
intervals at 95 %. R^2 is measured in the space the law is fitted in (log-log).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from linlm.errors import DataError

PFLOPS_DAY = 1e15 * 86400.0
"""FLOPs in one PFLOP/s-day."""

MIN_POWER_LAW_POINTS = 3
MIN_CHINCHILLA_POINTS = 8
MIN_ISOFLOP_RUNS = 3


@dataclass
class Curve:
    """One training run as the fits see it: the loss after each logged number of tokens."""

    name: str
    arch: str
    params: float  # non-embedding (active) parameters N
    paper_flops_per_token: float  # training FLOPs per token, paper convention (linlm.models.cost)
    tokens: np.ndarray
    loss: np.ndarray

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.float64)
        self.loss = np.asarray(self.loss, dtype=np.float64)

    @property
    def compute(self) -> np.ndarray:
        return self.tokens * self.paper_flops_per_token


def smooth(loss: np.ndarray, window: int) -> np.ndarray:
    """A centred moving mean over ``window`` logged losses (training loss is noisy step to step); window <= 1
    leaves the curve as it is."""
    if window <= 1 or len(loss) < 2:
        return loss
    from linlm.train.plot import smooth as centred_mean

    return np.asarray(centred_mean(loss.tolist(), window))


# ---- power laws ------------------------------------------------------------------------------------------


@dataclass
class PowerLaw:
    """y = beta * x^alpha, fitted in log space, with 95 % bootstrap intervals and R^2 (log-log)."""

    beta: float
    alpha: float
    r2: float
    n_points: int
    beta_ci: tuple[float, float] = (math.nan, math.nan)
    alpha_ci: tuple[float, float] = (math.nan, math.nan)
    # Bootstrap replicates (log beta, alpha), kept for derived quantities such as a crossover's interval.
    samples: Optional[np.ndarray] = field(default=None, repr=False)

    def __call__(self, x):
        return self.beta * np.asarray(x, dtype=np.float64) ** self.alpha

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("samples")
        d["beta_ci"], d["alpha_ci"] = list(self.beta_ci), list(self.alpha_ci)
        return d


def _need(n: int, needed: int, what: str) -> None:
    if n < needed:
        raise DataError(f"{what}: {n} usable point{'s' if n != 1 else ''}, at least {needed} are needed; "
                        "train more runs (or longer ones) so that more points exist")


def _line(lx: np.ndarray, ly: np.ndarray) -> tuple[float, float, float]:
    """Least squares ly = a + b lx; returns (a, b, R^2)."""
    b, a = np.polyfit(lx, ly, 1)
    resid = ly - (a + b * lx)
    ss_tot = float(np.sum((ly - ly.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid ** 2)) / ss_tot if ss_tot > 0 else math.nan
    return float(a), float(b), r2


def _percentile_ci(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return (math.nan, math.nan)
    lo, hi = np.percentile(values, [2.5, 97.5])
    return (float(lo), float(hi))


def fit_power_law(x: Sequence[float], y: Sequence[float], *, bootstrap: int = 1000, seed: int = 0,
                  what: str = "power law") -> PowerLaw:
    """Fit y = beta x^alpha by least squares on (log x, log y); bootstrap the points for intervals."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    lx, ly = np.log(x[keep]), np.log(y[keep])
    _need(len(lx), MIN_POWER_LAW_POINTS, what)
    if np.ptp(lx) == 0:
        raise DataError(f"{what}: every point has the same x ({math.exp(lx[0]):.4g}); a power law needs a range")
    a, b, r2 = _line(lx, ly)
    law = PowerLaw(beta=math.exp(a), alpha=b, r2=r2, n_points=len(lx))
    if bootstrap:
        rng = np.random.default_rng(seed)
        reps = []
        n = len(lx)
        for _ in range(bootstrap):
            idx = rng.integers(0, n, n)
            if np.ptp(lx[idx]) == 0:
                continue
            bb, aa = np.polyfit(lx[idx], ly[idx], 1)
            reps.append((aa, bb))
        if reps:
            s = np.asarray(reps)
            law.samples = s
            lo, hi = _percentile_ci(s[:, 0])
            law.beta_ci = (math.exp(lo), math.exp(hi))
            law.alpha_ci = _percentile_ci(s[:, 1])
    return law


# ---- the envelope (approach 1) ---------------------------------------------------------------------------


def _usable(curves: Sequence[Curve], smooth_window: int, min_tokens_fraction: float, min_points: int = 2):
    """(curve, compute, smoothed loss, tokens) of each curve's finite points after its first
    ``min_tokens_fraction`` of tokens; curves with fewer than ``min_points`` such points are left out."""
    out = []
    for cv in curves:
        keep = np.isfinite(cv.loss) & (cv.tokens > 0)
        if min_tokens_fraction > 0 and keep.any():
            keep &= cv.tokens >= min_tokens_fraction * cv.tokens[keep].max()
        if keep.sum() >= min_points:
            out.append((cv, cv.compute[keep], smooth(cv.loss[keep], smooth_window), cv.tokens[keep]))
    return out


@dataclass
class Envelope:
    """The lowest loss at each compute value over a set of runs (compute in FLOPs)."""

    compute: np.ndarray
    loss: np.ndarray
    params: np.ndarray  # N of the run on the envelope
    tokens: np.ndarray  # tokens that run had seen at that compute
    run: list[str]  # which run
    # False where the envelope sits on the smallest or the largest size: there the optimum lies outside the
    # sampled sizes, so those points bend the fitted N_opt and L; the fits use only interior points.
    interior: np.ndarray = None


def _interp_log(c_grid: np.ndarray, c: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v interpolated linearly in log c at c_grid; NaN outside the run's range."""
    out = np.interp(np.log(c_grid), np.log(c), v, left=np.nan, right=np.nan)
    return out


def envelope(curves: Sequence[Curve], *, points: int = 60, smooth_window: int = 1,
             min_tokens_fraction: float = 0.0) -> Envelope:
    """The compute-optimal envelope of ``curves`` on a grid of ``points`` log-spaced compute values.

    ``min_tokens_fraction`` drops the start of each run (its first fraction of tokens), where warmup dominates.
    The grid spans from the smallest compute any run reaches to the largest; a grid value no run covers is left out.
    """
    usable = _usable(curves, smooth_window, min_tokens_fraction)
    _need(len(usable), 1, "envelope (runs with at least 2 logged losses)")
    lo = min(c.min() for _, c, _, _ in usable)
    hi = max(c.max() for _, c, _, _ in usable)
    grid = np.geomspace(lo, hi, points)
    table = np.stack([_interp_log(grid, c, l) for _, c, l, _ in usable])  # runs x grid
    covered = np.isfinite(table).any(axis=0)
    table = np.where(np.isfinite(table), table, np.inf)  # inf: the run does not reach this compute
    best = np.argmin(table, axis=0)
    grid, best = grid[covered], best[covered]
    loss = table[best, np.flatnonzero(covered)]
    params = np.array([usable[i][0].params for i in best])
    tokens = np.array([grid[j] / usable[i][0].paper_flops_per_token for j, i in enumerate(best)])
    # Bracketed: some run reaching this compute is smaller than the chosen one and some is larger (so both
    # neighbours were seen to be worse). Where the chosen run is the smallest or largest still running, the
    # optimum may lie outside the sampled sizes.
    sizes = np.array([cv.params for cv, _, _, _ in usable])[:, None]
    reach = np.isfinite(table[:, covered])
    interior = ((reach & (sizes < params[None])).any(axis=0) & (reach & (sizes > params[None])).any(axis=0))
    return Envelope(grid, loss, params, tokens, [usable[i][0].name for i in best], interior)


@dataclass
class EnvelopeFit:
    """L(C), N_opt(C) and D_opt(C) fitted on an envelope, C in PFLOP/s-days. N_opt and D_opt are None when the
    fitted points all lie on one size (then N_opt is flat by construction and says nothing)."""

    loss: PowerLaw
    params: Optional[PowerLaw]
    tokens: Optional[PowerLaw]
    envelope: Envelope

    def to_dict(self) -> dict:
        e = self.envelope
        return {"L(C)": self.loss.to_dict(), "N_opt(C)": self.params.to_dict() if self.params else None,
                "D_opt(C)": self.tokens.to_dict() if self.tokens else None,
                "envelope": {"compute_pflops_days": (e.compute / PFLOPS_DAY).tolist(), "loss": e.loss.tolist(),
                             "params": e.params.tolist(), "tokens": e.tokens.tolist(), "run": e.run}}


def fit_envelope(curves: Sequence[Curve], *, points: int = 60, smooth_window: int = 1,
                 min_tokens_fraction: float = 0.0, bootstrap: int = 1000, seed: int = 0,
                 interior_only: bool = True, what: str = "envelope") -> EnvelopeFit:
    """Power laws fitted on the envelope's interior points (all points when ``interior_only`` is False)."""
    env = envelope(curves, points=points, smooth_window=smooth_window, min_tokens_fraction=min_tokens_fraction)
    use = env.interior if interior_only else np.ones(len(env.compute), dtype=bool)
    if interior_only and use.sum() < MIN_POWER_LAW_POINTS:
        sizes = len({cv.params for cv in curves})
        raise DataError(f"{what}: only {int(use.sum())} envelope point(s) lie on a size other than the smallest or "
                        f"largest of the {sizes} size(s); at least {MIN_POWER_LAW_POINTS} are needed. Train at "
                        "least 3 sizes whose loss curves overtake one another (larger sizes, or longer runs)")
    c = env.compute[use] / PFLOPS_DAY
    kw = dict(bootstrap=bootstrap, seed=seed)
    loss = fit_power_law(c, env.loss[use], what=f"{what}: L(C)", **kw)
    if len(set(env.params[use].tolist())) < 2:
        return EnvelopeFit(loss=loss, params=None, tokens=None, envelope=env)
    return EnvelopeFit(loss=loss, params=fit_power_law(c, env.params[use], what=f"{what}: N_opt(C)", **kw),
                       tokens=fit_power_law(c, env.tokens[use], what=f"{what}: D_opt(C)", **kw), envelope=env)


# ---- crossover --------------------------------------------------------------------------------------------


def crossover(a: PowerLaw, b: PowerLaw) -> Optional[float]:
    """The x where beta_a x^alpha_a = beta_b x^alpha_b, or None for parallel laws (or a crossing beyond 1e304)."""
    if a.alpha == b.alpha:
        return None
    log_x = (math.log(b.beta) - math.log(a.beta)) / (a.alpha - b.alpha)
    return math.exp(log_x) if abs(log_x) < 700 else None  # beyond float range: as good as parallel


@dataclass
class Crossover:
    """Where two fitted L(C) cross (C in the laws' unit), which side is lower beyond it, and a bootstrap interval."""

    a: str
    b: str
    compute: Optional[float]
    ci: tuple[float, float]
    lower_after: Optional[str]  # the architecture with the lower loss at compute above the crossover

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "compute_pflops_days": self.compute, "ci": list(self.ci),
                "lower_after": self.lower_after}


def crossover_between(name_a: str, a: PowerLaw, name_b: str, b: PowerLaw) -> Crossover:
    x = crossover(a, b)
    lower = None
    if x is not None:  # a steeper (more negative) exponent wins beyond the crossing
        lower = name_a if a.alpha < b.alpha else name_b
    ci = (math.nan, math.nan)
    if a.samples is not None and b.samples is not None:
        m = min(len(a.samples), len(b.samples))
        la, aa = a.samples[:m, 0], a.samples[:m, 1]
        lb, ab = b.samples[:m, 0], b.samples[:m, 1]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            logs = (lb - la) / (aa - ab)
        lo, hi = _percentile_ci(logs)
        if math.isfinite(lo) and math.isfinite(hi):
            ci = (math.exp(max(min(lo, 700), -700)), math.exp(max(min(hi, 700), -700)))
    return Crossover(name_a, name_b, x, ci, lower)


# ---- Chinchilla's parametric law -------------------------------------------------------------------------


@dataclass
class ParametricFit:
    """L(N, D) = E + A / N^a + B / D^b (Hoffmann et al. 2022), with bootstrap intervals."""

    E: float
    A: float
    B: float
    a: float
    b: float
    r2: float  # of log L
    n_points: int
    huber_loss: float
    ci: dict = field(default_factory=dict)

    def __call__(self, n, d):
        n, d = np.asarray(n, dtype=np.float64), np.asarray(d, dtype=np.float64)
        return self.E + self.A / n ** self.a + self.B / d ** self.b

    @property
    def n_exponent(self) -> float:
        """N_opt ~ C^(b / (a + b)) when C is proportional to N D."""
        return self.b / (self.a + self.b)

    @property
    def d_exponent(self) -> float:
        return self.a / (self.a + self.b)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci"] = {k: list(v) for k, v in self.ci.items()}
        d["N_opt_exponent"], d["D_opt_exponent"] = self.n_exponent, self.d_exponent
        return d


HUBER_DELTA = 1e-3


def _huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Huber values and derivatives."""
    small = np.abs(r) <= delta
    val = np.where(small, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta))
    grad = np.where(small, r, delta * np.sign(r))
    return val, grad


def _parametric_objective(theta: np.ndarray, ln: np.ndarray, ld: np.ndarray, ll: np.ndarray, delta: float):
    """Huber loss of log L_hat - log L and its gradient; theta = (log A, log B, log E, a, b)."""
    la, lb, le, a, b = theta
    terms = np.stack([la - a * ln, lb - b * ld, np.full_like(ln, le)])
    m = terms.max(axis=0)
    w = np.exp(terms - m)
    s = w.sum(axis=0)
    pred = m + np.log(s)
    w /= s
    val, g = _huber(pred - ll, delta)
    grad = np.array([np.sum(g * w[0]), np.sum(g * w[1]), np.sum(g * w[2]),
                     np.sum(g * w[0] * -ln), np.sum(g * w[1] * -ld)])
    return float(val.sum()), grad


def _start_grid() -> np.ndarray:
    """Hoffmann et al.'s grid of initialisations (log A, log B in 0..25; log E in -1..1; a, b in 0..2)."""
    la = np.arange(0.0, 26.0, 5.0)
    le = np.arange(-1.0, 1.01, 0.5)
    ab = np.arange(0.0, 2.01, 0.5)
    g = np.stack(np.meshgrid(la, la, le, ab, ab, indexing="ij"), axis=-1).reshape(-1, 5)
    return g


def _best_starts(grid: np.ndarray, ln, ld, ll, delta: float, k: int) -> np.ndarray:
    """The k grid points with the lowest objective (evaluated in one vectorised pass)."""
    la, lb, le, a, b = (grid[:, i : i + 1] for i in range(5))
    terms = np.stack([la - a * ln[None], lb - b * ld[None], np.broadcast_to(le, (len(grid), len(ln)))])
    m = terms.max(axis=0)
    pred = m + np.log(np.exp(terms - m).sum(axis=0))
    val, _ = _huber(pred - ll[None], delta)
    return grid[np.argsort(val.sum(axis=1))[:k]]


def _fit_parametric_once(ln, ld, ll, starts: np.ndarray, delta: float) -> tuple[np.ndarray, float]:
    from scipy.optimize import minimize

    best, best_val = None, math.inf
    # log A, log B within Hoffmann et al.'s range and a margin; log E below 10 nats; exponents in [0, 5].
    bounds = [(-30.0, 60.0), (-30.0, 60.0), (-20.0, 2.5), (0.0, 5.0), (0.0, 5.0)]
    for x0 in starts:
        res = minimize(_parametric_objective, x0, args=(ln, ld, ll, delta), jac=True, method="L-BFGS-B",
                       bounds=bounds, options={"maxiter": 500, "ftol": 1e-14, "gtol": 1e-10})
        if res.fun < best_val:
            best, best_val = res.x, float(res.fun)
    return best, best_val


def fit_parametric(params: Sequence[float], tokens: Sequence[float], loss: Sequence[float], *,
                   bootstrap: int = 200, seed: int = 0, starts: int = 8, delta: float = HUBER_DELTA,
                   what: str = "L(N, D)") -> ParametricFit:
    n = np.asarray(params, dtype=np.float64)
    d = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    keep = np.isfinite(n) & np.isfinite(d) & np.isfinite(y) & (n > 0) & (d > 0) & (y > 0)
    ln, ld, ll = np.log(n[keep]), np.log(d[keep]), np.log(y[keep])
    _need(len(ll), MIN_CHINCHILLA_POINTS, what)
    if np.ptp(ln) == 0:
        raise DataError(f"{what}: every point has the same N; the parametric law needs runs of several sizes")
    grid = _best_starts(_start_grid(), ln, ld, ll, delta, starts)
    theta, val = _fit_parametric_once(ln, ld, ll, grid, delta)
    la, lb, le, a, b = theta
    pred = np.logaddexp(np.logaddexp(la - a * ln, lb - b * ld), le)
    ss_tot = float(np.sum((ll - ll.mean()) ** 2))
    r2 = 1.0 - float(np.sum((ll - pred) ** 2)) / ss_tot if ss_tot > 0 else math.nan
    fit = ParametricFit(E=math.exp(le), A=math.exp(la), B=math.exp(lb), a=float(a), b=float(b), r2=r2,
                        n_points=len(ll), huber_loss=val)
    if bootstrap:
        rng = np.random.default_rng(seed)
        reps = []
        starts_b = theta[None]  # each resample starts from the full-data optimum
        for _ in range(bootstrap):
            idx = rng.integers(0, len(ll), len(ll))
            t, _ = _fit_parametric_once(ln[idx], ld[idx], ll[idx], starts_b, delta)
            reps.append(t)
        s = np.asarray(reps)
        fit.ci = {"A": tuple(math.exp(v) for v in _percentile_ci(s[:, 0])),
                  "B": tuple(math.exp(v) for v in _percentile_ci(s[:, 1])),
                  "E": tuple(math.exp(v) for v in _percentile_ci(s[:, 2])),
                  "a": _percentile_ci(s[:, 3]), "b": _percentile_ci(s[:, 4])}
    return fit


def parametric_points(curves: Sequence[Curve], per_run: int = 20,
                      min_tokens_fraction: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, D, L) points for the parametric fit: up to ``per_run`` log-spaced logged points of each run."""
    ns, ds, ls = [], [], []
    for cv, _, l, t in _usable(curves, 1, min_tokens_fraction, min_points=1):
        idx = np.unique(np.round(np.geomspace(1, len(t), min(per_run, len(t)))).astype(int) - 1)
        ns.append(np.full(len(idx), cv.params))
        ds.append(t[idx])
        ls.append(l[idx])
    if not ns:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    return np.concatenate(ns), np.concatenate(ds), np.concatenate(ls)


# ---- IsoFLOP profiles (approach 2) -----------------------------------------------------------------------


@dataclass
class IsoFlopProfile:
    compute: float  # FLOPs
    params: list[float]
    loss: list[float]
    parabola: Optional[list[float]]  # coefficients of loss = p0 (log N)^2 + p1 log N + p2
    n_opt: Optional[float]
    interior: bool  # the parabola's minimum lies inside the sampled sizes


@dataclass
class IsoFlopFit:
    profiles: list[IsoFlopProfile]
    params: Optional[PowerLaw]  # N_opt(C), C in PFLOP/s-days
    tokens: Optional[PowerLaw]  # D_opt(C)

    def to_dict(self) -> dict:
        return {"profiles": [{**asdict(p), "compute_pflops_days": p.compute / PFLOPS_DAY} for p in self.profiles],
                "N_opt(C)": self.params.to_dict() if self.params else None,
                "D_opt(C)": self.tokens.to_dict() if self.tokens else None}


def isoflop(curves: Sequence[Curve], *, levels: int = 8, smooth_window: int = 1, bootstrap: int = 1000,
            seed: int = 0, min_tokens_fraction: float = 0.0, what: str = "IsoFLOP") -> IsoFlopFit:
    """Profiles at ``levels`` log-spaced compute values where at least 3 runs of different sizes meet."""
    usable = [(cv, c, l) for cv, c, l, _ in _usable(curves, smooth_window, min_tokens_fraction)]
    _need(len({cv.params for cv, _, _ in usable}), MIN_ISOFLOP_RUNS, f"{what} (runs of different sizes)")
    lo = min(c.min() for _, c, _ in usable)
    hi = max(c.max() for _, c, _ in usable)
    profiles = []
    for level in np.geomspace(lo, hi, levels + 2)[1:-1]:
        pts = [(cv.params, float(_interp_log(np.array([level]), c, l)[0])) for cv, c, l in usable]
        pts = sorted((n, l) for n, l in pts if np.isfinite(l))
        if len({n for n, _ in pts}) < MIN_ISOFLOP_RUNS:
            continue
        x = np.log([n for n, _ in pts])
        y = np.array([l for _, l in pts])
        p = np.polyfit(x, y, 2)
        n_opt, interior = None, False
        if p[0] > 0:
            v = -p[1] / (2 * p[0])
            n_opt, interior = float(math.exp(v)), bool(x.min() < v < x.max())
        profiles.append(IsoFlopProfile(float(level), [float(n) for n, _ in pts], y.tolist(), p.tolist(), n_opt,
                                       interior))
    inside = [p for p in profiles if p.interior]
    n_law = d_law = None
    if len(inside) >= MIN_POWER_LAW_POINTS:
        c = np.array([p.compute for p in inside])
        n = np.array([p.n_opt for p in inside])
        # D_opt = C / (FLOPs per token at N_opt), the FLOPs per token interpolated log-log across the runs.
        sizes = sorted({(cv.params, cv.paper_flops_per_token) for cv, _, _ in usable})
        fpt = np.exp(np.interp(np.log(n), np.log([s[0] for s in sizes]), np.log([s[1] for s in sizes])))
        kw = dict(bootstrap=bootstrap, seed=seed)
        n_law = fit_power_law(c / PFLOPS_DAY, n, what=f"{what}: N_opt(C)", **kw)
        d_law = fit_power_law(c / PFLOPS_DAY, c / fpt, what=f"{what}: D_opt(C)", **kw)
    return IsoFlopFit(profiles, n_law, d_law)
