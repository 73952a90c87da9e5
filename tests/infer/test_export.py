"""linlm export: the exported prefill and step (state as explicit tensors) give the eager logits."""

import pytest
import torch

from linlm import create_model
from linlm.cli import main
from linlm.errors import ConfigError


@pytest.mark.slow
def test_exported_prefill_and_steps_match_eager(tmp_path, capsys):
    model = create_model("cosformer2", preset="tiny", n_layers=1).eval()  # LRPE positions and a TPE state
    model.save(tmp_path / "m")
    assert main(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "e"), "--prefill-len", "12"]) == 0
    assert "wrote" in capsys.readouterr().out
    prefill = torch.export.load(tmp_path / "e.prefill.pt2").module()
    step = torch.export.load(tmp_path / "e.step.pt2").module()
    ids = torch.randint(0, 512, (1, 12))
    with torch.no_grad():
        want, state = model.prefill(ids)
        got, *flat = prefill(ids)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        for i, tok in enumerate([5, 77, 300]):
            t = torch.tensor([tok])
            want, state = model.step(t, state)
            got, *flat = step(t, torch.tensor(12 + i), *flat)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    # Never over what exists.
    assert main(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "e")]) == 2
    assert "already exist" in capsys.readouterr().err


def test_mossnet_export_is_refused_clearly(tmp_path):
    from linlm.infer.export import export

    with pytest.raises(ConfigError, match="MossNet's routed experts"):
        export(create_model("mossnet", preset="tiny"), tmp_path / "x")
