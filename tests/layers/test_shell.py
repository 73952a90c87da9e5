"""Model shells on the meta device (linlm.layers.shell): every architecture's, with no random init and no import of
torch._dynamo, of the same names, shapes and dtypes as the model built for real; a saved model loads from one."""

import json
import subprocess
import sys

import pytest
import torch

from linlm.layers.mamba import DT_MAX, DT_MIN
from linlm.layers.shell import computed, meta_device
from linlm.models.lm import CausalLM
from linlm.models.model_config import ModelConfig
from linlm.models.registry import arch_names

# Each architecture, then hybrids with attention (full and sliding-window): ModelConfig's fields.
TINY = dict(d_model=64, n_layers=2, vocab_size=97, n_heads=4)
CONFIGS = [{**TINY, **extra} for extra in [dict(arch=a) for a in arch_names()]
           + [dict(arch="hgrn2", attn_layers=[1]), dict(arch="mamba", attn_every=2, attn_window=8)]]


def _cfg(values: dict) -> ModelConfig:
    return ModelConfig(**{**TINY, **values})


# In a process of its own: whether anything imported torch._dynamo is a fact of the whole process.
_PROBE = """
import json, sys
from linlm.layers.shell import meta_device
from linlm.models.lm import CausalLM
from linlm.models.model_config import ModelConfig
out = []
for values in json.loads(sys.argv[1]):
    with meta_device():
        model = CausalLM(ModelConfig(**values))
    out.append([values, all(t.is_meta for t in model.state_dict().values())])
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "sympy": "sympy" in sys.modules, "shells": out}))
"""


def test_shells_import_no_dynamo():
    """Arithmetic or a random fill on a meta tensor imports torch._dynamo, and linspace sympy (together about
    80 MiB of a process's resident set): no architecture's shell may do any of these."""
    run = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(CONFIGS)], capture_output=True, text=True,
                         check=True)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert [values for values, all_meta in result["shells"] if not all_meta] == []
    assert len(result["shells"]) == len(CONFIGS)
    assert not result["dynamo"] and not result["sympy"]


@pytest.mark.parametrize("default_dtype", [torch.float32, torch.float64])
def test_shell_matches_real_model(default_dtype):
    """Under either default dtype: values made without a dtype follow it, in the shell as in the real model."""
    was = torch.get_default_dtype()
    torch.set_default_dtype(default_dtype)
    try:
        _compare_shells()
    finally:
        torch.set_default_dtype(was)


def _compare_shells():
    for values in CONFIGS:
        cfg = _cfg(values)
        with meta_device():
            shell = CausalLM(cfg)
        real = CausalLM(cfg)
        got = {k: (tuple(t.shape), t.dtype) for k, t in shell.state_dict().items()}
        want = {k: (tuple(t.shape), t.dtype) for k, t in real.state_dict().items()}
        assert got == want, values
        # the non-persistent buffers too (TNL's decays): the same shapes and dtypes
        assert {k: (tuple(b.shape), b.dtype) for k, b in shell.named_buffers()} == \
            {k: (tuple(b.shape), b.dtype) for k, b in real.named_buffers()}, values


def test_computed_values_off_meta():
    """Off the meta device, computed() returns the values; on it, an empty tensor of the shape, unevaluated."""
    calls = []

    def values():
        calls.append(1)
        return torch.arange(6.0).view(2, 3)

    assert torch.equal(computed((2, 3), values), torch.arange(6.0).view(2, 3)) and calls == [1]
    with meta_device():
        out = computed((2, 3), values)
    assert out.is_meta and tuple(out.shape) == (2, 3) and out.dtype == torch.float32 and calls == [1]


def test_real_init_unchanged_by_the_shell_helpers():
    """The computed initial values of a real build: Mamba's S4D-real A and its dt bias, cosFormer2's frequencies."""
    torch.manual_seed(0)
    model = CausalLM(_cfg(dict(arch="mamba")))
    mixer = model.layers[0].mixer
    N = mixer.A_log.shape[-1]
    assert torch.equal(mixer.A_log, torch.log(torch.arange(1, N + 1, dtype=torch.float32)).expand_as(mixer.A_log))
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert float(dt.min()) >= DT_MIN * 0.999 and float(dt.max()) <= DT_MAX * 1.001 and float(dt.std()) > 0
    cos = CausalLM(_cfg(dict(arch="cosformer2"))).layers[0].mixer
    K = cos.theta.shape[-1]
    assert torch.allclose(cos.theta[0], 10000.0 ** (-2.0 * torch.arange(K, dtype=torch.float32) / K))
