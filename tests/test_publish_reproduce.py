"""benchmarks/publish_reproduce.py: a finished reproduce job becomes a results file whose claims are judged from its
sections, with each section's time and the evidence the verdicts rest on; an unfinished one is refused; the page
shows the verdicts; and every published verdict is computed again from its file by the current judging code."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import publish_reproduce  # noqa: E402
import render_results  # noqa: E402

CREATED = "2026-01-01T10:00:00Z"
T0 = 1767261600.0  # CREATED as a Unix time


def fake_job(root: Path, pending=(), failed=None) -> Path:
    """A job directory as `linlm reproduce` leaves it: its marker, results.json and two saved sections, written
    12 and 30 minutes after the job was created. MossNet's three seeds lie wholly below both baselines'."""
    quality = {"models": {f"{a}-0.8m-s{i}": {"arch": a, "seed": i, "val_loss": v + 0.01 * i, "params": 1000}
                          for a, v in (("mossnet", 3.0), ("llama", 3.2), ("mamba", 3.3)) for i in range(3)}}
    sections = {"scaling": {"runs": []}, "compare_quality": quality}
    (root / "sections").mkdir(parents=True)
    for minutes, (name, result) in zip((12, 30), sections.items()):
        path = root / "sections" / f"{name}.json"
        path.write_text(json.dumps(result))
        os.utime(path, (T0 + 60 * minutes, T0 + 60 * minutes))
    env = {"git_revision": "a" * 40, "git_dirty": False, "torch_version": "2.13.0+cpu",
           "cpu": {"model_name": "Test CPU", "bf16_flags": [], "native_bf16": False}}
    (root / "reproduce.json").write_text(json.dumps({"preset": "cpu", "created": CREATED, "environment": env}))
    (root / "results.json").write_text(json.dumps({"sections": sections, "pending": list(pending),
                                                   "failed": failed or {}, "waiting": {}, "claims": [],
                                                   "settings": {"seeds": None}}))
    return root


def test_a_finished_job_is_published_with_its_claims_and_times(tmp_path):
    job = fake_job(tmp_path / "job")
    assert publish_reproduce.publish(job, "linlm reproduce")["settings"] == {"seeds": None}
    data = publish_reproduce.publish(job, "linlm reproduce --recipe cpu --out runs/rep", "DIR")
    assert data["settings"] == {"seeds": None, "data_dir": "DIR"}
    assert data["meta"]["git_revision"] == "a" * 40 and data["meta"]["command"].startswith("linlm reproduce")
    assert [(r["section"], round(r["minutes"], 3)) for r in data["sections"]] == [("scaling", 12.0),
                                                                                  ("compare_quality", 18.0)]
    assert data["total_minutes"] == pytest.approx(30.0)
    verdicts = {c["claim"]: c["verdict"] for c in data["claims"]}
    assert verdicts["MossNet beats transformer and SSM baselines"] == "for"
    assert verdicts["Linear models scale like transformers"] == "cannot tell"
    # The evidence: what the claims read, per seed, and nothing of the sections they do not read.
    models = data["evidence"]["compare_quality"]["models"]
    assert models["mossnet-0.8m-s1"] == {"arch": "mossnet", "group": None, "seed": 1, "val_loss": 3.01, "params": 1000}
    assert set(data["evidence"]) == {"compare_quality"}
    path = tmp_path / "reproduce_cpu.json"
    path.write_text(json.dumps(data))
    page = render_results.render(path)
    assert "# linlm reproduce: recipe cpu" in page and "30.0 minutes in all" in page
    row = next(line for line in page.splitlines() if line.startswith("| MossNet beats transformer"))
    assert "| for |" in row and "a test computes every verdict again from it" in page
    assert "| compare_quality | 2026-01-01T10:30:00+00:00 | 18.0 |" in page
    assert "## What the recipe's size gives up" in page and "2 degrees of freedom" in page  # the cpu recipe's


def test_a_stated_pause_is_taken_out_of_the_section_it_fell_in(tmp_path):
    """The job stopped 20 to 25 minutes after it was created (inside the second section, which ended at 30) and
    was continued: that section counts 13 minutes, not 18, and the page names the pause."""
    job = fake_job(tmp_path / "job")
    pause = publish_reproduce.parse_pause("2026-01-01T10:20:00Z/2026-01-01T10:25:00Z")
    data = publish_reproduce.publish(job, "linlm reproduce", paused=[pause])
    assert [(r["section"], round(r["minutes"], 3), round(r.get("paused_minutes", 0), 3)) for r in data["sections"]] \
        == [("scaling", 12.0, 0), ("compare_quality", 13.0, 5.0)]
    assert data["total_minutes"] == pytest.approx(25.0)
    path = tmp_path / "reproduce_cpu.json"
    path.write_text(json.dumps(data))
    page = render_results.render(path)
    assert "25.0 minutes in all" in page and "2026-01-01T10:20:00+00:00 to 2026-01-01T10:25:00+00:00" in page
    assert "| compare_quality | 2026-01-01T10:30:00+00:00 | 13.0 | 5.0 |" in page
    for bad in ("2026-01-01T10:25:00Z/2026-01-01T10:20:00Z", "yesterday"):
        with pytest.raises(SystemExit, match="--paused"):
            publish_reproduce.parse_pause(bad)


@pytest.mark.parametrize("state", [{"pending": ["mqar"]}, {"failed": {"niah": "DataError: x"}}])
def test_an_unfinished_job_is_refused(tmp_path, state):
    job = fake_job(tmp_path / "job", **state)
    with pytest.raises(SystemExit, match="has not finished"):
        publish_reproduce.publish(job, "linlm reproduce --recipe cpu")
    with pytest.raises(SystemExit, match="is not a reproduce job"):
        publish_reproduce.publish(tmp_path, "linlm reproduce --recipe cpu")


def recomputed(data: dict) -> list[dict]:
    """The file's claims judged again from its evidence by this checkout's code, as the file stores them."""
    from linlm.reproduce.claims import judge
    from linlm.outputs import dumps

    return json.loads(dumps([c.to_dict() for c in judge(data["evidence"])]))


def test_every_published_verdict_is_the_current_codes_from_its_file():
    """Each results file of a reproduce job that holds its evidence: every claim, verdict, reason, difference and
    interval is what the current judging code computes from that evidence. A file from before the one rule keeps
    only its verdicts, and its page says they cannot be judged again."""
    pages = sorted((ROOT / "docs" / "results").glob("reproduce_*.json"))
    assert pages
    for path in pages:
        data = json.loads(path.read_text(encoding="utf-8"))
        if "evidence" in data:
            assert recomputed(data) == data["claims"], f"{path.name}: a verdict differs from the current rule's"
        else:
            page = path.with_suffix(".md").read_text(encoding="utf-8")
            assert "cannot be judged again from it" in page, path.name


def test_the_recomputation_catches_a_changed_number(tmp_path):
    data = json.loads(json.dumps(publish_reproduce.publish(fake_job(tmp_path / "job"), "linlm reproduce")))
    assert recomputed(data) == data["claims"]
    models = data["evidence"]["compare_quality"]["models"]
    for i in range(3):  # MossNet's seeds now above LLaMA's: the verdict the file states no longer follows
        models[f"mossnet-0.8m-s{i}"]["val_loss"] = 3.5 + 0.01 * i
    again = recomputed(data)
    assert again != data["claims"]
    assert next(c for c in again if c["key"] == "mossnet-beats")["verdict"] == "against"
