"""The sections of ``linlm reproduce``, in the order the job runs them: one module each (training holds both
training sections, quality both quality sections, retrieval_studies the aspect and context studies, hybrid the
hybrid stacks' study, mossnet_ladder MossNet's optional ladder and its fits, downstream the scores of the
checkpoints kept along training against compute), each defining its
:class:`linlm.reproduce.section.Section`.

Adding a section: write its module here (its settings dataclass, its ``measure``, its ``run`` from the job, its
``render``, the record naming its recipe key and settings) and add the record to :data:`SECTIONS`. The recipes
(which keys they may hold, each checked against its section's dataclass), the job, its directory rules, its
settings, the plan and the report all read the list when they run.
"""

from __future__ import annotations

from linlm.errors import ConfigError
from linlm.reproduce.section import Section, option_rows
from linlm.reproduce.sections import (decode, downstream, fits, hybrid, long_context, mossnet_ladder, mqar, niah,
                                      quality, retrieval_studies, training, zeroshot)

SECTIONS: tuple[Section, ...] = (training.SCALING, training.COMPARE, fits.SECTION, quality.QUALITY,
                                 quality.COMPARE_QUALITY, zeroshot.SECTION, niah.SECTION, downstream.SECTION,
                                 long_context.SECTION,
                                 mqar.SECTION,
                                 decode.SECTION, retrieval_studies.ASPECT, retrieval_studies.CONTEXT,
                                 hybrid.SECTION,
                                 mossnet_ladder.MOSSNET, mossnet_ladder.MOSSNET_FITS)


def get(name: str) -> Section:
    return {s.name: s for s in SECTIONS}[name]


def affected_by(setting: str) -> tuple[str, ...]:
    """The sections whose numbers the job setting ``setting`` changes, in the order they run."""
    return tuple(s.name for s in SECTIONS if setting in s.settings)


def recipe_keys() -> dict[str, type]:
    """{recipe key: its settings dataclass} of every section that has settings, in the order the sections run. Two
    sections may read one key only with one dataclass (a programming error otherwise, not a user's)."""
    keys: dict[str, type] = {}
    for s in SECTIONS:
        if s.key is None:
            continue
        if keys.setdefault(s.key, s.options) is not s.options:
            raise ConfigError(f"section {s.name}: its key {s.key!r} is another section's with other settings")
    return keys


def readers(key: str) -> list[str]:
    """The sections that read the recipe key ``key``."""
    return [s.name for s in SECTIONS if s.key == key]


def settings_rows() -> list[list[str]]:
    """docs/reproduce.md's settings table: (key, the sections that read it, field, default, meaning), one row per
    field of each key's dataclass."""
    return [[key, ", ".join(readers(key)), name, default, doc]
            for key, cls in recipe_keys().items() for name, default, doc in option_rows(cls)]


def settings_markdown() -> str:
    """:func:`settings_rows` as docs/reproduce.md's table (a test holds the page to it)."""
    lines = ["| key | read by | field | default | meaning |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{k}` | {readers} | `{f}` | `{d}` | {doc} |" for k, readers, f, d, doc in settings_rows()]
    return "\n".join(lines)
