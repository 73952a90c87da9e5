"""logits_to_keep: the logits of the last k positions only, equal to those of the full head."""

import pytest
import torch

from linlm import create_model


@pytest.mark.parametrize("arch", ["llama", "tnl", "mamba"])
def test_logits_to_keep_is_the_tail_of_the_full_logits(arch):
    model = create_model(arch, preset="tiny").eval()
    ids = torch.randint(0, 512, (2, 23))
    with torch.no_grad():
        full = model(ids)
        out = model(ids, logits_to_keep=5, return_state=True)
        last, state = model.prefill(ids)
    assert out.logits.shape == (2, 5, 512)
    torch.testing.assert_close(out.logits, full[:, -5:])
    torch.testing.assert_close(last, full[:, -1])
    assert state.offset == 23
