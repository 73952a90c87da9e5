"""The runs of the MQAR experiment: every architecture at each width, MossNet's grid of SSM experts E x routing
policies, and the baselines sized to MossNet two ways, at equal active parameters and at equal state size.

MossNet's runs differ only in the token mixer: the MLP is one dense SwiGLU expert, so that E and the policy are the
only variables. A policy is written ``routed-kN`` (each expert's state advances only on the tokens routed to it, N
experts per token), ``dense`` (every expert's state sees every token and the router's softmax over all E gates the
outputs: gated linear multi-head attention with E heads) or ``dense-kN`` (every state sees every token, the top N
outputs are gated). Routed with k = E is the same model as dense (every state sees every token, every output is
gated), so it is trained once, as dense; with E = 1 every policy is the one-expert model (a Mamba block plus the
MLP), trained once as ``mossnet-E1``; a k above E is left out.

The matched baselines (:func:`matched_runs`), at each width where MossNet runs:

- equal active parameters: the registry's baseline and each SSM without an MLP, sized to the one-expert MossNet's
  active parameters (an architecture with an MLP through its GLU width, one without through as many layers as fit
  and then ``dt_rank``), counted on the meta device;
- equal state size: each SSM with ``d_state`` E times MossNet's, so that its state per layer is MossNet-E's.

Which runs are compared with which is decided from the measured numbers (:mod:`linlm.experiments.mqar_summary`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from linlm.errors import ConfigError

DEFAULT_EXPERTS = (1, 2, 4)
DEFAULT_POLICIES = ("routed-k1", "routed-k2", "dense")
# MossNet's MLP in every run: one dense SwiGLU, so that the token mixer is the only thing that differs.
MOSSNET_MLP = {"mlp_experts": 1, "mlp_top_k": 1}
_POLICY = re.compile(r"(routed|dense)(?:-k(\d+))?")


@dataclass
class MQARRun:
    """One model of the experiment: an architecture, a width, model config overrides and the seed it trains with
    (its initialisation, its training stream and its test set)."""

    arch: str
    d_model: int
    label: str = ""
    overrides: Optional[dict] = None
    seed: int = 0
    lr: Optional[float] = None  # its own learning rate (None: the experiment's)
    study: dict = field(default_factory=dict)  # what a study's run varies: {"shape": "d48-l3"}, {"context": 64}

    def name(self) -> str:
        """The configuration's name, shared by its seeds: ``LABEL-dWIDTH`` (the width last)."""
        return self.label or f"{self.arch}-d{self.d_model}"

    def dir_name(self) -> str:
        """Its directory below the experiment's: one per (configuration, seed)."""
        return f"{self.name()}-s{self.seed}"


@dataclass(frozen=True)
class Policy:
    """A routing policy as written (``routed-k2``, ``dense``, ``dense-k2``): the layer's ``ssm_policy`` and k
    (None: every expert)."""

    text: str
    ssm_policy: str
    k: Optional[int]


def parse_policy(text: str) -> Policy:
    m = _POLICY.fullmatch(text.strip())
    if m is None or (m.group(1) == "routed" and m.group(2) is None) or (m.group(2) is not None and int(m.group(2)) < 1):
        raise ConfigError(f"mqar policy {text!r}: expected routed-kN (N >= 1), dense or dense-kN, e.g. "
                          f"{','.join(DEFAULT_POLICIES)}")
    return Policy(text.strip(), m.group(1), None if m.group(2) is None else int(m.group(2)))


def mossnet_run(d: int, experts: int, policy: Policy) -> Optional[MQARRun]:
    """MossNet with ``experts`` SSM experts under ``policy`` at width d, named by the model it is (see the module
    doc); None when the policy's k exceeds E."""
    k = experts if policy.k is None else policy.k
    if k > experts:
        return None
    kind = "routed" if policy.ssm_policy == "routed" and k < experts else "dense"
    if experts == 1:
        label = "mossnet-E1"
    elif kind == "dense" and k == experts:
        label = f"mossnet-E{experts}-dense"
    else:
        label = f"mossnet-E{experts}-{kind}-k{k}"
    over = {"ssm_experts": experts, "ssm_top_k": k, "ssm_policy": kind, **MOSSNET_MLP}
    return MQARRun("mossnet", d, f"{label}-d{d}", over)


def mossnet_runs(d: int, experts: Sequence[int], policies: Sequence[str]) -> list[MQARRun]:
    """Every distinct MossNet model of the E x policy grid at width d, in the order given."""
    runs: dict[str, MQARRun] = {}
    parsed = [parse_policy(p) for p in policies]
    for e in experts:
        if e < 1:
            raise ConfigError(f"mqar experts: {e} SSM experts; give counts >= 1 (or none: no MossNet runs)")
        for policy in parsed:
            run = mossnet_run(d, e, policy)
            if run is not None:
                runs.setdefault(run.name(), run)
    return list(runs.values())


# RoPE's base in every attention layer the experiment trains (LLaMA's, and a hybrid's): Llama 3's. With 16-wide
# heads, the original 10,000 turns all but the slowest two or three frequency pairs through more than a radian
# across 64 tokens, so q.k cannot match a key by its content alone; the 2-layer, width-64 LLaMA then sat at 0.24 on
# 16 pairs after 2,000 steps, and reached 0.99 by step 750 with this base (or with half its channels unrotated).
ROPE_THETA = 500_000.0


def model_overrides(run: MQARRun, n_layers: int, head_dim: int, vocab_size: int, seq_len: int) -> dict:
    """The model config of a run: the experiment's shape at the run's width, then the run's own overrides.

    Two settings differ from the language models' defaults, both for every architecture alike: the head is not tied
    to the embeddings (as in LLaMA's own models; tied, a 2-layer LLaMA learned to copy some value of its context
    and stopped there, about 0.3 on 4 pairs after 1,500 steps, against 0.99 within 500 steps untied), and attention
    layers rotate with base :data:`ROPE_THETA`. A run's overrides (its ``options`` or ``attn_options`` included)
    take precedence."""
    if head_dim < 1 or run.d_model % head_dim:
        raise ConfigError(f"mqar {run.name()}: d_model {run.d_model} is not a multiple of head_dim {head_dim}; "
                          "choose widths that are multiples of the head dimension (or another head dimension)")
    from linlm.models.registry import baseline_arch

    over = {"d_model": run.d_model, "n_layers": n_layers, "n_heads": run.d_model // head_dim,
            "glu_dim": 2 * run.d_model, "max_seq_len": max(64, seq_len), "chunk_size": 16,
            "vocab_size": vocab_size, "tie_embeddings": False, **(run.overrides or {})}
    key = ("options" if run.arch == baseline_arch() else
           "attn_options" if over.get("attn_every") or over.get("attn_layers") else None)
    if key:
        over[key] = {"rope_theta": ROPE_THETA, **(over.get(key) or {})}
    return over


def counted(run: MQARRun, shape: dict) -> dict:
    """linlm.models.counting's counts of the run's model (parameters, FLOPs per token at the task's length), on the
    meta device (``shape``: model_overrides' other arguments)."""
    from linlm.models.counting import count
    from linlm.models.presets import preset_config

    return count(preset_config(run.arch, None, **model_overrides(run, **shape)), batch=1, seq_len=shape["seq_len"])


def active_params(run: MQARRun, shape: dict) -> int:
    """Active non-embedding parameters of the run, counted on the meta device."""
    return counted(run, shape)["active_non_embedding_params"]


def _solve(run: MQARRun, key: str, shape: dict, target: int, at: int, step: int) -> int:
    """The value of the integer option ``key`` that brings the run's active parameters nearest ``target`` (they grow
    linearly with it): two counts and a line through them."""
    def size(value: int) -> int:
        return active_params(MQARRun(run.arch, run.d_model, run.label, {**(run.overrides or {}), key: value}), shape)

    lo = size(at)
    per = (size(at + step) - lo) / step
    return max(1, round(at + (target - lo) / per)) if per > 0 else at


def equal_params_run(arch: str, d: int, shape: dict, target: int) -> MQARRun:
    """``arch`` at width d sized to ``target`` active parameters: its GLU width where it has an MLP, else as many
    layers as fit at dt_rank 1 and then its ``dt_rank``."""
    from linlm.models.registry import get_arch

    run = MQARRun(arch, d, f"{arch}-eqparams-d{d}", {})
    if get_arch(arch).mlp is not None:
        run.overrides["glu_dim"] = _solve(run, "glu_dim", shape, target, 2 * d, 8)
        return run
    # As many layers as fit at the smallest dt_rank, then the rank (which only adds) closes the gap: a layer is a
    # coarse step at these widths, a unit of rank a fine one.
    run.overrides["dt_rank"] = 1
    run.overrides["n_layers"] = layers = max(1, int(target // active_params(run, {**shape, "n_layers": 1})))
    run.overrides["dt_rank"] = _solve(run, "dt_rank", {**shape, "n_layers": layers}, target, 1, 1)
    return run


def one_wide_run(d: int, like: str, shape: dict) -> MQARRun:
    """One SSM expert (``mossnet-E1-wide``) widened (its ``expand``) to the active parameters of the MossNet
    ``like`` (``E4-routed-k2``: E experts, k of them a token): the model the heads claim compares E experts with,
    one head as large as the k heads together."""
    e, _, policy = like.partition("-")
    target_run = mossnet_run(d, int(e.removeprefix("E")), parse_policy(policy))
    if target_run is None:
        raise ConfigError(f"mqar wide_to {like!r}: its k exceeds its E; give E<n>-<policy>, e.g. E4-routed-k2")
    target = active_params(target_run, shape)
    one = mossnet_run(d, 1, parse_policy("dense"))
    run = MQARRun("mossnet", d, f"mossnet-E1-wide-d{d}", {**one.overrides})
    # The inner width in whole multiples of d (as far as it stays below the target), then the dt rank (a finer
    # step that only adds) closes the gap, as equal_params_run does for an SSM without an MLP.
    expand = 2
    while active_params(MQARRun("mossnet", d, run.label, {**run.overrides, "expand": expand + 1}), shape) <= target:
        expand += 1
    run.overrides["expand"] = expand
    run.overrides["dt_rank"] = _solve(run, "dt_rank", shape, target, max(1, -(-d // 16)), 1)
    return run


def matched_runs(d: int, experts: Sequence[int], archs: Sequence[str], shape: dict, equal_params: bool = True,
                 equal_state: Optional[Sequence[str]] = None) -> list[MQARRun]:
    """The baselines of :func:`equal_params_run` (target: the one-expert MossNet at width d; ``equal_params``) and
    the SSMs with E times MossNet's ``d_state`` for each E >= 2 of ``experts`` (E = 1: the SSM of the width
    itself): those of ``archs``, or the SSMs ``equal_state`` names."""
    from linlm.models.archs.base import SSM
    from linlm.models.model_config import ModelConfig
    from linlm.models.registry import arch_names, baseline_arch, get_arch

    ssms = [a for a in arch_names(SSM) if a in archs and get_arch(a).mlp is None]
    candidates = [a for a in dict.fromkeys([baseline_arch(), *ssms]) if a in archs]
    if equal_state is not None:
        unknown = [a for a in equal_state if a not in arch_names(SSM) or get_arch(a).mlp is not None]
        if unknown:
            raise ConfigError(f"mqar equal_state: {unknown} are no SSMs without an MLP; choose among "
                              f"{[a for a in arch_names(SSM) if get_arch(a).mlp is None]}")
        ssms = list(equal_state)
    runs = []
    if equal_params:
        target = active_params(mossnet_run(d, 1, parse_policy("dense")), shape)
        runs = [equal_params_run(a, d, shape, target) for a in candidates]
    n = ModelConfig(arch="mossnet").options.d_state
    for e in (e for e in dict.fromkeys(experts) if e >= 2):
        runs += [MQARRun(a, d, equal_state_label(a, e, d), {"d_state": e * n}) for a in ssms]
    return runs


def equal_state_label(arch: str, experts: int, d: int = 0) -> str:
    """The name of ``arch`` with ``experts`` times MossNet's d_state (equal state per layer to MossNet-E), at width
    ``d`` (0: without the width)."""
    from linlm.models.model_config import ModelConfig

    return f"{arch}-N{experts * ModelConfig(arch='mossnet').options.d_state}" + (f"-d{d}" if d else "")


def default_archs() -> list[str]:
    """Every registered architecture but the mixtures of experts (MossNet joins through ``experts``), in registry
    order: the architectures an MQAR experiment trains unless told otherwise."""
    from linlm.models.archs.base import MIXTURE
    from linlm.models.registry import arch_names, get_arch

    return [name for name in arch_names() if get_arch(name).family != MIXTURE]


def default_runs(widths=(32, 64), experts: Sequence[int] = DEFAULT_EXPERTS, archs: Optional[Sequence[str]] = None,
                 policies: Sequence[str] = DEFAULT_POLICIES, seeds: Sequence[int] = (0,), matched: bool = True, *,
                 n_layers: int = 2, head_dim: int = 16, vocab_size: int = 64, seq_len: int = 16,
                 equal_params: Optional[bool] = None, equal_state: Optional[Sequence[str]] = None,
                 wide_to: Optional[str] = None, per_arch: Optional[dict] = None) -> list[MQARRun]:
    """Every architecture (``archs``, default :func:`default_archs`; ``per_arch[arch]``: its model config
    overrides, e.g. the options that give it another's state per layer) at each width, MossNet's E x policy grid
    (:func:`mossnet_runs`; ``experts`` empty: no MossNet runs) and, where MossNet runs and ``matched``, the
    baselines of :func:`matched_runs`; each configuration once per seed. The shape (``n_layers`` ...) must be the
    experiment's, since the matched baselines are sized from it."""
    if not seeds:
        raise ConfigError("mqar seeds: give at least one seed (a count >= 1)")
    for p in policies:  # every policy is checked, also where no MossNet runs
        parse_policy(p)
    archs = default_archs() if archs is None else list(archs)
    shape = {"n_layers": n_layers, "head_dim": head_dim, "vocab_size": vocab_size, "seq_len": seq_len}
    configs: list[MQARRun] = []
    for d in widths:
        configs.extend(MQARRun(arch, d, overrides=dict((per_arch or {})[arch]) if arch in (per_arch or {}) else None)
                       for arch in archs)
        moss = mossnet_runs(d, experts, policies) if experts else []
        configs.extend(moss)
        if wide_to:
            configs.append(one_wide_run(d, wide_to, shape))
        eq_params = matched if equal_params is None else equal_params
        eq_state = (None if matched else []) if equal_state is None else equal_state
        if moss and (eq_params or eq_state is None or eq_state):
            configs.extend(matched_runs(d, experts, archs, shape, eq_params, eq_state))
    return [MQARRun(c.arch, c.d_model, c.label, c.overrides, s, c.lr, c.study) for s in seeds for c in configs]
