"""An architecture's own options through transformers: saved as attributes of the config and loaded back (the
earlier formats: tests/hf/test_hf_config.py)."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from linlm.hf.configuration import CONFIG_CLASSES, hf_config_for  # noqa: E402
from linlm.hf.modeling import to_hf  # noqa: E402
from linlm.models.archs.cosformer2 import CosFormer2Options  # noqa: E402
from hf_helpers import tiny  # noqa: E402


def _model(arch, **options):
    # Six heads: TNL's two slope rules differ (they agree when the head count is a power of two).
    return tiny(arch, d_model=48, n_heads=6, options=options)


@pytest.mark.parametrize("arch,options", [("tnl", {"slopes": "pow2", "v_silu": False}),
                                          ("cosformer2", {"gate_before_norm": False, "tpe": False})])
def test_options_round_trip_through_save_pretrained(tmp_path, arch, options):
    model = _model(arch, **options)
    to_hf(model).save_pretrained(tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {k: saved[k] for k in options} == options and "options" not in saved
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert back.model.config == model.config
    ids = torch.randint(0, 512, (2, 13))
    with torch.no_grad():
        # TNL's decays are rebuilt when transformers materialises the model: by the saved slope rule.
        torch.testing.assert_close(back(ids).logits, model(ids), rtol=0, atol=0)


def test_hf_config_carries_the_options():
    cfg = _model("cosformer2", tpe=False).config
    hf = hf_config_for(cfg)
    assert type(hf) is CONFIG_CLASSES["cosformer2"] and (hf.gate_before_norm, hf.tpe) == (True, False)
    assert hf.to_linlm().options == CosFormer2Options(gate_before_norm=True, tpe=False)
