"""fla's own HGRN2ForCausalLM against its linlm conversion, where fla runs (a CUDA GPU with flash-linear-attention
installed; benchmarks/gpu_check.sh runs this file). Elsewhere it skips.

A tiny random fla model (float32) is saved, converted with ``linlm convert`` and run by linlm on the CPU; the
logits must agree to 1e-5. The sequence is 48 tokens, where fla's HGRN2 takes its fused recurrent kernel (it
switches to the chunked one past 64), so that both sides sum in float32 without TF32 matrix products."""

import pytest
import torch

import linlm
from fla_reference import save_like_pretrained

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (fla's kernels are Triton)", allow_module_level=True)
fla_models = pytest.importorskip("fla.models")

VARIANTS = {
    "fla_defaults": dict(),
    "no_lower_bound_tied_no_affine": dict(use_lower_bound=False, tie_word_embeddings=True, elementwise_affine=False),
    "short_conv": dict(use_short_conv=True, conv_size=4),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_fla_hgrn2_and_its_linlm_conversion_agree(tmp_path, name):
    torch.manual_seed(0)
    config = fla_models.HGRN2Config(hidden_size=64, num_hidden_layers=2, expand_ratio=16, vocab_size=101,
                                    intermediate_size=96, **VARIANTS[name])
    fla = fla_models.HGRN2ForCausalLM(config).float().cuda().eval()
    with torch.no_grad():  # random, asymmetric weights everywhere, norms and lower bounds included
        for p in fla.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_like_pretrained(fla, tmp_path / "fla")
    linlm.convert(tmp_path / "fla", tmp_path / "ours")
    ours = linlm.load(tmp_path / "ours").eval()
    ids = torch.randint(0, 101, (2, 48))
    with torch.no_grad():
        want = fla(ids.cuda()).logits.float().cpu()
        got = ours(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
