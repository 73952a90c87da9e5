"""Shared by the transformers conversion tests: random, asymmetric checkpoints and token ids."""

import torch


def perturbed(hf):
    """``hf`` (a transformers model, in eval mode) with noise added to every weight but A_log (the decays keep
    their init): norms, D, dt biases and all are then unlike their inits and unlike each other."""
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if not name.endswith("A_log"):
                p.add_(torch.randn_like(p) * 0.1)
    return hf.eval()


def token_ids(vocab: int, T: int) -> torch.Tensor:
    """Two rows of T token ids below ``vocab``, the same at every call."""
    return torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(5))


def assert_refused(saved, tmp_path, capsys, field, value, needle: str) -> None:
    """config.json of the checkpoint directory ``saved`` with ``field`` set to ``value`` is refused: by
    ``linlm.convert`` with a CheckpointError containing ``needle``, and by ``linlm convert`` with one line naming
    ``field`` and exit 2; nothing is written either way."""
    import json
    import re

    import pytest

    import linlm
    from linlm.cli import main
    from linlm.errors import CheckpointError
    from output_asserts import one_line_error

    path = saved / "config.json"
    config = json.loads(path.read_text())
    config[field] = value
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=re.escape(needle)):
        linlm.convert(saved, tmp_path / "ours")
    assert not (tmp_path / "ours").exists()
    capsys.readouterr()  # transformers' progress bars from save_pretrained
    assert main(["convert", str(saved), "--out", str(tmp_path / "ours")]) == 2
    one_line_error(capsys.readouterr().err, field)
