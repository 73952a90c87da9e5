"""The architecture registry: one line per architecture.

Each architecture lives in its own module under models/archs/ (its mixer and MLP builders, its norm, the paper's
FLOP formula, its preset rule, its validation) and defines ``SPEC``. Adding one means writing that module and
adding its line below. Every architecture is the same pre-norm residual stack (models/lm.py).

:func:`register` (also ``linlm.register``) checks an entry before it enters: a name already taken, or a mixer that
breaks the token-mixer contract (linlm.layers.mixer), is a one-line ConfigError naming what is missing.
Architectures outside this package register from plugins (models/plugins.py), which the ``linlm`` command loads
first.
"""

from __future__ import annotations

from linlm.errors import ConfigError, choices_text
from linlm.layers.mixer import contract_gaps
from linlm.layers.norm import NORM_KINDS
from linlm.models.archs import (cosformer2, deltanet, gated_deltanet, gla, hgrn2, llama, mamba, mamba2, mossnet,
                                retnet, tnl)
from linlm.models.archs.base import BASELINE, FAMILIES, ArchSpec

ARCHITECTURES: dict[str, ArchSpec] = {}


def register(spec: ArchSpec) -> ArchSpec:
    """Add ``spec`` to the registry, after checking it: a ConfigError names a duplicate name or what its mixer
    lacks of the token-mixer contract (:class:`linlm.layers.mixer.TokenMixer`)."""
    if not isinstance(spec, ArchSpec):
        raise ConfigError(f"register: expected an ArchSpec (linlm.ArchSpec), got {type(spec).__name__}")
    where = f"register({spec.name!r})"
    if spec.name in ARCHITECTURES:
        raise ConfigError(f"{where}: an architecture named {spec.name!r} is already registered "
                          f"({ARCHITECTURES[spec.name].description}); choose another name")
    gaps = contract_gaps(spec.mixer)
    if gaps:
        name = getattr(spec.mixer, "__name__", repr(spec.mixer))
        raise ConfigError(f"{where}: its mixer {name} breaks the token-mixer contract: it lacks " + "; ".join(gaps)
                          + " (see linlm.layers.mixer)")
    if spec.norm not in NORM_KINDS:
        raise ConfigError(f"{where}: norm {spec.norm!r} is not one of {choices_text(NORM_KINDS)}")
    ARCHITECTURES[spec.name] = spec
    return spec


register(llama.SPEC)
register(tnl.SPEC)
register(hgrn2.SPEC)
register(cosformer2.SPEC)
register(mamba.SPEC)
register(mossnet.SPEC)
register(deltanet.SPEC)
register(gated_deltanet.SPEC)
register(mamba2.SPEC)
register(gla.SPEC)
register(retnet.SPEC)


def arch_names(*families: str, scaling_study: bool = False) -> list[str]:
    """Registered architectures in registry order: all, or those of the given families (and of the scaling study).

    Every default list of architectures (CLI defaults, ladders, claims, benchmarks) is derived from this, so that a
    newly registered architecture is seen everywhere.
    """
    for family in families:
        if family not in FAMILIES:
            raise ConfigError(f"family: unknown family {family!r}; valid choices are {choices_text(FAMILIES)}")
    return [name for name, spec in ARCHITECTURES.items()
            if (not families or spec.family in families) and (spec.scaling_study or not scaling_study)]


def baseline_arch() -> str:
    """The softmax-attention baseline every comparison is made against (the first one registered)."""
    return arch_names(BASELINE)[0]


def arch_color(name: str) -> str:
    """An architecture's colour in every plot; grey for a name not registered (a run of an architecture since
    removed)."""
    spec = ARCHITECTURES.get(name)
    return spec.color if spec is not None else ArchSpec.color


def get_arch(name: str) -> ArchSpec:
    if name not in ARCHITECTURES:
        raise ConfigError(f"arch: unknown architecture {name!r}; valid choices are {choices_text(ARCHITECTURES)}")
    return ARCHITECTURES[name]
