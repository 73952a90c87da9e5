"""profile, export and generate on numbers no machine can honour, or interrupted: refused before any allocation with
the estimate and what is available, an allocation failure as an error row, and a stopped generation keeps its text."""

from __future__ import annotations

import time

import pytest
import torch
from output_asserts import forbid, one_line_error, snapshot

from linlm.cli import main


def test_profile_of_a_context_beyond_memory_is_refused_at_once(tmp_path, capsys, monkeypatch):
    forbid(monkeypatch, "linlm.infer.profile.build", why="no model may be built for a refused context")
    started = time.perf_counter()
    assert main(["profile", "--archs", "tnl", "--preset", "tiny", "--no-hf", "--contexts", "512,1000000000",
                 "--json", str(tmp_path / "p.json")]) == 2
    assert time.perf_counter() - started < 10
    one_line_error(capsys.readouterr().err, "--contexts 1000000000: a prefill of 1,000,000,000 tokens of tnl needs at "
                   "least", "GiB of memory;", "is available (", "give shorter contexts or a smaller batch")
    assert list(tmp_path.iterdir()) == []


def test_profile_estimate_uses_the_machine_s_figure(monkeypatch, capsys):
    import linlm.resources

    monkeypatch.setattr(linlm.resources, "available_memory", lambda device=None: (2**20, "a test"))
    forbid(monkeypatch, "linlm.infer.profile.build", why="no model may be built for a refused context")
    assert main(["profile", "--archs", "llama", "--preset", "tiny", "--no-hf", "--contexts", "4096"]) == 2
    one_line_error(capsys.readouterr().err, "--contexts 4096: a prefill of 4,096 tokens of llama", "1.0 MiB is "
                   "available (a test)")


def test_an_allocation_failure_in_a_context_is_its_row_and_the_others_run(monkeypatch):
    import linlm.infer.profile as prof

    real = prof.profile_one

    def fail_at_64(runner, vocab, context, device, decode_tokens, batch=1):
        if context == 64:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                               "tried to allocate 999 bytes")
        return real(runner, vocab, context, device, decode_tokens, batch)

    monkeypatch.setattr(prof, "profile_one", fail_at_64)
    rows = prof.profile(["tnl"], "tiny", [16, 64, 32], decode_tokens=1)
    assert [r.context for r in rows] == [16, 64, 32]
    assert rows[1].error.startswith("out of memory") and rows[0].error is None and rows[2].error is None


def test_export_of_a_prefill_beyond_memory_is_refused_before_tracing(tokenizer, tmp_path, capsys, monkeypatch):
    from linlm import create_model

    model = tmp_path / "tnl"
    create_model("tnl", preset="tiny", vocab_size=320).save(model)  # no position limit: only memory bounds it
    forbid(monkeypatch, "linlm.infer.export.export_programs", why="nothing may be traced for a refused prefill")
    before = snapshot(tmp_path)
    assert main(["export", "--model", str(model), "--out", str(tmp_path / "m"), "--prefill-len",
                 "1000000000"]) == 2
    one_line_error(capsys.readouterr().err, "prefill_len 1000000000 x batch 1: tracing a prefill of 1,000,000,000 "
                   "tokens needs at least", "give a shorter --prefill-len")
    assert snapshot(tmp_path) == before


def test_generate_streams_by_default(model_dir, capsys, monkeypatch):
    import linlm.infer.cli as cli

    seen = []
    real = cli.print_generation
    monkeypatch.setattr(cli, "print_generation", lambda prompt, pieces, stream: seen.append(stream) or real(
        prompt, pieces, stream))
    args = ["generate", "--model", str(model_dir), "--prompt", "the queen", "--max-new-tokens", "4", "--seed", "1"]
    assert main(args) == 0
    streamed = capsys.readouterr().out
    assert main(args + ["--no-stream"]) == 0
    assert capsys.readouterr().out == streamed and seen == [True, False]


@pytest.mark.parametrize("stream", [True, False])
def test_ctrl_c_keeps_what_was_decoded(stream, capsys):
    import io

    from linlm.infer.cli import print_generation

    def pieces():
        yield " the"
        yield " king"
        raise KeyboardInterrupt

    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        print_generation("ROMEO:", pieces(), stream, out=out)
    assert out.getvalue() == "ROMEO: the king\n"


def test_max_new_tokens_has_a_documented_bound(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir), "--max-new-tokens", str(2**20 + 1)]) == 2
    one_line_error(capsys.readouterr().err, "argument --max-new-tokens: expected a whole number from 0 to 1048576")
    assert torch.get_num_threads() >= 1


def test_profile_estimate_counts_the_largest_batch(monkeypatch, capsys):
    """--batch multiplies the prefill: a context that fits alone is refused at a batch that cannot fit."""
    forbid(monkeypatch, "linlm.infer.profile.build", why="no model may be built for a refused batch")
    assert main(["profile", "--archs", "tnl", "--preset", "tiny", "--no-hf", "--contexts", "1000000",
                 "--batch", "1,1000000"]) == 2
    one_line_error(capsys.readouterr().err, "--contexts 1000000 --batch 1000000: a prefill of 1,000,000 x 1,000,000 "
                   "tokens of tnl needs at least", "give shorter contexts or a smaller batch")
