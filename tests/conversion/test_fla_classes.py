"""Checkpoints written by flash-linear-attention's own model classes, where fla is installed (it skips elsewhere,
and fla's Triton kernels need a GPU, so fla's forward is not run here): each is built on the CPU from fla's config
class, its weights perturbed, saved as fla lays it out (config.json from the config class, the state dict as
safetensors), converted by ``linlm convert``, and its logits compared in float64 with the reference written from
fla's equations for that family (fla_reference.py, fla_gla_reference.py, fla_delta_reference.py), on the very
tensors fla's classes made. This checks what the other tests take on trust: that the references' names, shapes and
config defaults are fla's."""

import json

import pytest
import torch

import linlm

fla_models = pytest.importorskip("fla.models")

import fla_delta_reference  # noqa: E402
import fla_gla_reference  # noqa: E402
import fla_reference  # noqa: E402

TINY = dict(hidden_size=32, num_hidden_layers=2, vocab_size=61)
CASES = {
    "hgrn2": ("HGRN2", fla_reference, dict(expand_ratio=8)),
    "gla": ("GLA", fla_gla_reference, dict(num_heads=2)),
    "delta_net": ("DeltaNet", fla_delta_reference, dict(num_heads=4)),
    "gated_deltanet": ("GatedDeltaNet", fla_delta_reference, dict(num_heads=2, head_dim=12)),
    "gated_deltanet_grouped_values": ("GatedDeltaNet", fla_delta_reference,
                                      dict(num_heads=2, head_dim=12, num_v_heads=4, expand_v=1.0)),
}


@pytest.mark.parametrize("name", CASES)
def test_a_checkpoint_of_flas_own_classes_converts_to_what_its_equations_compute(tmp_path, name):
    prefix, reference, options = CASES[name]
    torch.manual_seed(0)
    config = getattr(fla_models, f"{prefix}Config")(**TINY, **options)
    model = getattr(fla_models, f"{prefix}ForCausalLM")(config).eval()
    with torch.no_grad():  # random, asymmetric weights everywhere, norms included
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    source = fla_reference.save_like_pretrained(model, tmp_path / "fla")
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    linlm.convert(source, tmp_path / "ours")
    ours = linlm.load(tmp_path / "ours").eval().double()
    written = json.loads((source / "config.json").read_text())
    ids = torch.randint(0, TINY["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    want = reference.forward(written, sd, ids)
    assert want.abs().max() > 0.5
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), want, rtol=0, atol=1e-5)
