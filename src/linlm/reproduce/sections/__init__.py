"""The sections of ``linlm reproduce``, in the order the job runs them: one module each (training holds both
training sections, quality both quality sections, shape the optional studies and the sections that read them),
each defining its :class:`linlm.reproduce.section.Section`.

Adding a section: write its module here (its ``measure``, its ``run`` from the job, its ``render``, the record),
add the record to :data:`SECTIONS`, and its settings to the recipes (a field of
:class:`linlm.reproduce.recipes.Recipe` and a key in recipes/*.yaml). The job, its directory rules, its settings,
the plan and the report all read the list.
"""

from __future__ import annotations

from linlm.reproduce.section import Section
from linlm.reproduce.sections import decode, fits, mqar, niah, quality, shape, training, zeroshot

SECTIONS: tuple[Section, ...] = (training.SCALING, training.COMPARE, fits.SECTION, quality.QUALITY,
                                 quality.COMPARE_QUALITY, zeroshot.SECTION, niah.SECTION, mqar.SECTION,
                                 decode.SECTION, shape.ASPECT, shape.ASPECT_LOSS, shape.CONTEXT, shape.CONTEXT_LOSS,
                                 shape.MOSSNET, shape.MOSSNET_FITS)


def get(name: str) -> Section:
    return {s.name: s for s in SECTIONS}[name]


def affected_by(setting: str) -> tuple[str, ...]:
    """The sections whose numbers the job setting ``setting`` changes, in the order they run."""
    return tuple(s.name for s in SECTIONS if setting in s.settings)
