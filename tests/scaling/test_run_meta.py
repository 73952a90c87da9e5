"""scaling.json: the paper FLOPs per token under their own name, and files written under the old name still read."""

from __future__ import annotations

import json

import pytest
from output_asserts import one_line_error
from scaling_helpers import write_run

from linlm.cli import main
from linlm.scaling.ladder import load_ladder, plan_runs
from linlm.scaling.runs import FLOPS_KEY, OLD_FLOPS_KEY, flops_key, load_runs

TOKENS, LOSS = [1e6, 2e6, 4e6], [5.0, 4.5, 4.2]


def test_a_file_with_the_old_key_reads_as_one_with_the_new(tmp_path):
    write_run(tmp_path / "new", "tnl-a", "tnl", 2e6, TOKENS, LOSS)
    write_run(tmp_path / "old", "tnl-a", "tnl", 2e6, TOKENS, LOSS, flops_key=OLD_FLOPS_KEY)
    (new,), (old,) = load_runs(tmp_path / "new").runs, load_runs(tmp_path / "old").runs
    assert FLOPS_KEY in new.meta and OLD_FLOPS_KEY in old.meta and OLD_FLOPS_KEY not in new.meta
    assert new.curve.paper_flops_per_token == old.curve.paper_flops_per_token == 12e6
    assert list(new.curve.compute) == list(old.curve.compute)
    assert flops_key(new.meta) == FLOPS_KEY and flops_key(old.meta) == OLD_FLOPS_KEY
    assert flops_key({}) == FLOPS_KEY  # neither: the error names the current key


def test_a_description_without_flops_per_token_is_skipped_naming_the_key(tmp_path):
    run = write_run(tmp_path / "sweep", "tnl-a", "tnl", 2e6, TOKENS, LOSS)
    meta = json.loads((run / "scaling.json").read_text())
    del meta[FLOPS_KEY]
    (run / "scaling.json").write_text(json.dumps(meta))
    (why,) = dict(load_runs(tmp_path / "sweep").skipped).values()
    assert "unreadable run description" in why and FLOPS_KEY in why


@pytest.mark.parametrize("key", [FLOPS_KEY, OLD_FLOPS_KEY])
def test_impossible_flops_are_refused_under_the_name_the_file_uses(key, tmp_path, capsys):
    root = tmp_path / "sweep"
    for i, n in enumerate([1e6, 2e6, 4e6]):
        write_run(root, f"llama-{i}", "llama", n, TOKENS, LOSS, flops_key=key)
    run = root / "runs" / "llama-1"
    meta = json.loads((run / "scaling.json").read_text())
    (run / "scaling.json").write_text(json.dumps({**meta, key: 0}))
    assert main(["scaling", "fit", str(root), "--bootstrap", "0", "--parametric-bootstrap", "0"]) == 2
    one_line_error(capsys.readouterr().err, str(run / "scaling.json"), f"{key} is 0", "llama-1")


def test_emitted_run_descriptions_carry_the_planned_costs(tmp_path, capsys):
    ladder = load_ladder("smoke")
    runs = plan_runs(ladder, ["tnl"], tmp_path / "sweep")
    assert main(["scaling", "run", "--ladder", "smoke", "--archs", "tnl", "--out", str(tmp_path / "sweep"),
                 "--emit", "torchrun"]) == 0
    capsys.readouterr()
    for r in runs:
        meta = json.loads((tmp_path / "sweep" / "runs" / r.name / "scaling.json").read_text())
        assert OLD_FLOPS_KEY not in meta
        assert (meta[FLOPS_KEY], meta["head_flops_per_token"], meta["params"]) == (
            r.paper_flops_per_token, r.head_flops_per_token, r.params)
        assert meta["compute_flops"] == r.compute == r.paper_flops_per_token * r.tokens
        assert r.training_flops == r.tokens * (r.paper_flops_per_token + r.head_flops_per_token) > r.compute
        assert r.step_flops == r.tokens_per_step * (r.paper_flops_per_token + r.head_flops_per_token)
