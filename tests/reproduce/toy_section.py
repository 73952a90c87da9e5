"""A section as docs/architecture.md's "Adding a section" describes one: this module (its settings dataclass, its
run, its render and its record) and one line in the section list (the test adds the record to SECTIONS)."""

from __future__ import annotations

from dataclasses import dataclass

from linlm.errors import ConfigError
from linlm.reproduce.section import Section, heading, setting

CALLS: list[str] = []  # each run of the section, by the greeting it was given


@dataclass
class ToySettings:
    """The recipe's ``toy:``."""

    greeting: str = setting("hello", "what the toy section says")
    repeat: int = setting(2, "how many times it says it")

    def validate(self) -> "ToySettings":
        if self.repeat < 1:
            raise ConfigError(f"repeat: {self.repeat}; give 1 or more")
        return self


def run(job, tick) -> dict:
    toy = job.recipe.toy
    CALLS.append(toy.greeting)
    tick(1.0)
    return {"said": " ".join([toy.greeting] * toy.repeat)}


def render(job, pending):
    blocks, result = heading(job, "A toy section", pending, "toy")
    return blocks if result is None else blocks + [("p", f"The toy said: {result['said']}.")]


SECTION = Section("toy", run, 0.01, render=render, report_rank=99, key="toy", options=ToySettings,
                  plan=lambda recipe: f"toy: says {recipe.toy.greeting!r} {recipe.toy.repeat} times")
