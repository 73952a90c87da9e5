"""from_pretrained of a transformers directory whose weights are stored as integers or hold a NaN is refused in one
line naming the tensor, instead of loading a model that computes wrong or NaN logits."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import tiny
from safetensors.torch import load_file, save_file

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from linlm.errors import CheckpointError  # noqa: E402
from linlm.hf.modeling import to_hf  # noqa: E402


@pytest.fixture
def saved(tmp_path):
    model = tiny("tnl", vocab_size=64)
    to_hf(model).save_pretrained(tmp_path / "hf")
    return model, tmp_path / "hf", tmp_path / "hf" / "model.safetensors"


def test_a_good_directory_loads_with_the_same_logits(saved):
    model, path, _ = saved
    ids = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(path)(ids).logits, model(ids))


def test_weights_stored_as_integers_are_refused(saved):
    _, path, file = saved
    tensors = load_file(str(file))
    name = sorted(tensors)[0]
    tensors[name] = (tensors[name] * 100).to(torch.int32)  # a broken conversion: loads as its integer values
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"tensor '{name}' is stored as I32, not as floating point") as e:
        AutoModelForCausalLM.from_pretrained(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_holding_nan_or_inf_are_refused(saved, bad):
    _, path, file = saved
    tensors = load_file(str(file))
    name = sorted(tensors)[-1]
    tensors[name].view(-1)[3] = bad
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"tensor '{name}' holds 1 NaN or infinite values"):
        AutoModelForCausalLM.from_pretrained(path)
