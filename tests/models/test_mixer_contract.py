"""The token-mixer contract (linlm.layers.mixer): every registered mixer keeps it, and register() refuses one that
does not, in one line naming what is missing (through the command line too: exit 2, before any work)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import linlm
from linlm.cli import main
from linlm.errors import ConfigError
from linlm.layers.mixer import TokenMixer, contract_gaps, meta, spec_mismatch, spec_of
from linlm.models.archs.base import ArchSpec, sglu
from linlm.models.lm import create_model
from linlm.models.plugins import PLUGINS_ENV
from linlm.models.registry import ARCHITECTURES

# Every registered architecture, and the variants whose state has another shape.
VARIANTS = [(arch, {}) for arch in ARCHITECTURES] + [
    ("hgrn2", {"options": {"short_conv": 4}}), ("mossnet", {"ssm_kernel": "ssd"}), ("mossnet", {"ssm_policy": "dense"}),
    ("llama", {"n_kv_heads": 1}),
]


def _id(v):
    arch, overrides = v
    return arch + "".join(f"-{k}" for k in overrides)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_the_state_is_what_state_spec_says(variant, dtype):
    """After a prefill and after a step, every layer's state (and the embeddings') has the nesting, shapes and
    dtypes of state_spec, each tensor batch-first; nbytes is the spec's, and constant_state says whether it grows."""
    arch, overrides = variant
    model = create_model(arch, preset="tiny", **overrides).to(dtype).eval()
    ids = torch.randint(0, 512, (3, 7))
    _, state = model.prefill(ids)
    spec = model.state_spec(3, 7)
    assert all(t.device.type == "meta" for t in spec.tensors())
    assert spec_mismatch(spec.layers, state.layers) is None and spec_mismatch(spec.extra, state.extra) is None
    assert spec.nbytes() == state.nbytes() == model.state_nbytes(3, 7) > 0
    assert all(t.shape[0] == 3 for t in state.tensors())
    _, state = model.step(ids[:, 0], state)
    assert spec_mismatch(model.state_spec(3, 8).layers, state.layers) is None
    grows = model.state_nbytes(1, 1000) > model.state_nbytes(1, 1)
    assert grows is not model.spec.constant_state


def test_spec_mismatch_names_the_first_difference():
    spec = {"conv": meta(2, 3, 8, dtype=torch.float32), "ssm": meta(2, 8, 4, dtype=torch.float32)}
    state = {"conv": torch.zeros(2, 3, 8), "ssm": torch.zeros(2, 8, 5)}
    assert spec_mismatch(spec, spec_of(state)) == ("state['ssm'] is [2, 8, 5] float32, its state_spec says "
                                                   "[2, 8, 4] float32")
    assert spec_mismatch(spec, {"conv": torch.zeros(2, 3, 8)}) is not None
    assert spec_mismatch((spec["conv"],), [torch.zeros(2, 3, 8)]) is not None  # a list is not the tuple it promised
    assert spec_mismatch(spec, {k: torch.zeros(v.shape) for k, v in spec.items()}) is None


def test_tnl_decays_are_recomputed_by_init_buffers():
    """TNL's decays are a computed buffer: poisoned (as memory materialised from the meta device is), init_buffers()
    gives back exactly the decays of a fresh model."""
    model = create_model("tnl", preset="tiny", options={"slopes": "alibi"})
    fresh = [layer.mixer.log_decay.clone() for layer in model.layers]
    assert "layers.0.mixer.log_decay" not in model.state_dict()
    for layer in model.layers:
        layer.mixer.log_decay.fill_(float("nan"))
    model.init_buffers()
    for layer, want in zip(model.layers, fresh):
        assert torch.equal(layer.mixer.log_decay, want)
    assert not torch.equal(fresh[0], fresh[1])  # one per layer


def _forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
    return x, None


def _mixer(name: str, **methods) -> type:
    return type(name, (TokenMixer,), methods)


COMPLETE = dict(forward=_forward, state_spec=lambda self, b, n, dtype: meta(b, 1, dtype=dtype),
                mixing_flops_per_token=lambda self, n: 0.0)


def _spec(name: str, mixer) -> ArchSpec:
    return ArchSpec(name, mixer, sglu, "srms", f"{name}: a test mixer")


@pytest.mark.parametrize("mixer, lacks", [
    (_mixer("NoFlops", forward=_forward, state_spec=COMPLETE["state_spec"]),
     "it lacks a FLOP hook, mixing_flops_per_token(seq_len)"),
    (_mixer("NoSpec", forward=_forward, mixing_flops_per_token=COMPLETE["mixing_flops_per_token"]),
     "it lacks state_spec(batch, context, dtype)"),
    (_mixer("NoCtx", **{**COMPLETE, "forward": lambda self, x, *, state=None, reset=None, return_state=False: x}),
     "it lacks forward keywords offset, ctx (the signature is forward(self, x, *, state=None, reset=None, offset=0, "
     "return_state=False, ctx=None))"),
    (_mixer("Nothing"), "it lacks forward(self, x, *, state=None"),
    (type("Plain", (nn.Module,), {**COMPLETE}), "it lacks the base class linlm.TokenMixer"),
])
def test_register_refuses_a_mixer_that_breaks_the_contract(mixer, lacks):
    with pytest.raises(ConfigError) as e:
        linlm.register(_spec("broken", mixer))
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"register('broken'): its mixer {mixer.__name__} breaks the "
                                                      "token-mixer contract: ")
    assert lacks in message
    assert "broken" not in ARCHITECTURES


def test_a_mixer_lacking_several_pieces_hears_of_all_of_them():
    gaps = contract_gaps(_mixer("Nothing"))
    assert len(gaps) == 3 and gaps[1].startswith("state_spec") and gaps[2].startswith("a FLOP hook")
    assert contract_gaps(_mixer("Complete", **COMPLETE)) == []
    # flops_per_token (the whole forward counted by the mixer, as MossNet does) is a FLOP hook too.
    whole = {**COMPLETE, "flops_per_token": COMPLETE["mixing_flops_per_token"]}
    del whole["mixing_flops_per_token"]
    assert contract_gaps(_mixer("Whole", **whole)) == []


def test_register_refuses_a_taken_name_and_keeps_the_first():
    before = ARCHITECTURES["tnl"]
    with pytest.raises(ConfigError, match=r"^register\('tnl'\): an architecture named 'tnl' is already registered "
                                          r"\(TNL: .*\); choose another name$"):
        linlm.register(_spec("tnl", _mixer("Complete", **COMPLETE)))
    assert ARCHITECTURES["tnl"] is before


def test_a_computed_buffer_without_init_buffers_is_refused_when_built(monkeypatch):
    class Forgetful(TokenMixer):
        def __init__(self, cfg, layer_idx):
            super().__init__(cfg, layer_idx)
            self.register_buffer("table", torch.arange(4.0), persistent=False)

        forward, state_spec = _forward, COMPLETE["state_spec"]
        mixing_flops_per_token = COMPLETE["mixing_flops_per_token"]

    monkeypatch.setitem(ARCHITECTURES, "forgetful", _spec("forgetful", Forgetful))
    with pytest.raises(ConfigError, match=r"^arch 'forgetful': layers.0.mixer.table, layers.1.mixer.table is a "
                                          r"computed buffer \(persistent=False\) that no init_buffers\(\) computes"):
        create_model("forgetful", preset="tiny")


PLUGIN = '''
import linlm
from linlm.layers.mixer import TokenMixer
from linlm.models.archs.base import ArchSpec, sglu


class NoFlops(TokenMixer):
    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        return x, None

    def state_spec(self, batch, context, dtype):
        return None


linlm.register(ArchSpec("plugged", NoFlops, sglu, "srms", "a plugin's architecture"))
'''


def test_a_plugin_breaking_the_contract_stops_the_command_before_any_work(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_arch_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PLUGINS_ENV, "my_arch_plugin")
    out = tmp_path / "run"
    assert main(["train", "--config", "demo", "--out", str(out), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("linlm: error: LINLM_PLUGINS: my_arch_plugin: register('plugged'): its mixer NoFlops breaks the "
                   "token-mixer contract: it lacks a FLOP hook, mixing_flops_per_token(seq_len) (0.0 when everything "
                   "is in its nn.Linear layers) (see linlm.layers.mixer)")
    assert not out.exists() and "plugged" not in ARCHITECTURES
    sys.modules.pop("my_arch_plugin", None)


def test_a_plugin_that_cannot_be_imported_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv(PLUGINS_ENV, "no_such_linlm_plugin")
    assert main(["archs"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("linlm: error: LINLM_PLUGINS: no_such_linlm_plugin: cannot be imported "
                          "(ModuleNotFoundError: ") and "\n" not in err


def test_every_built_in_architecture_has_a_colour_of_its_own():
    """Plots tell architectures apart by colour alone: two built-ins sharing one would be read as one model."""
    from linlm.models.registry import arch_color

    colours = {name: arch_color(name) for name in ARCHITECTURES}
    shared = {c: sorted(n for n in colours if colours[n] == c) for c in colours.values()
              if list(colours.values()).count(c) > 1}
    assert shared == {}
    assert ArchSpec.color not in colours.values()  # grey is a removed architecture's
