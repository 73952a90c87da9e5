"""Fixtures of the reproduce tests (the helpers live in reproduce_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from reproduce_helpers import MODEL, Fakes, fake_zeroshot_models


@pytest.fixture
def fakes(monkeypatch) -> Fakes:
    """Every section runner replaced: training writes a finished sweep, the evaluation sections return minimal
    results of their real shape; the zero-shot section is the real one, on stand-in models (task files whose
    text is "bad" fail to score, any other text scores). The retrieval studies (aspect, context, hybrid) train
    their tiny MQAR runs for real, without drawing each run's loss curve (half their time; no test here reads
    those plots)."""
    import linlm.train.report
    from linlm.reproduce import section
    from linlm.reproduce.sections import decode, fits, mqar, niah, quality, training

    f = Fakes()
    monkeypatch.setattr(training, "train_sweep", f.train_sweep)
    monkeypatch.setattr(section, "trained_models", lambda sweep, largest_only: {"llama": dict(MODEL)}
                        if (Path(sweep) / "plan.json").is_file() else {})
    monkeypatch.setattr(fits, "measure", f.section("fits", {"runs": [], "archs": {}, "report": {}}))
    monkeypatch.setattr(quality, "measure", f.section("quality", {"models": {}, "max_tokens": 1}))
    monkeypatch.setattr(niah, "measure", f.section("niah", {"settings": {}, "models": {}}))
    monkeypatch.setattr(mqar, "measure", f.section("mqar", {"task": {"num_kv": 1, "vocab_size": 8}, "chance": 0.2,
                                                            "rows": [], "plot": "mqar.png", "settings": {}}))
    monkeypatch.setattr(decode, "measure", f.section("decode", {"rows": [], "environment": {}, "plot": "decode.png",
                                                                "settings": {}}))
    monkeypatch.setattr(linlm.train.report, "plot_loss_curve", lambda records, path, title: None)
    fake_zeroshot_models(monkeypatch)
    return f
