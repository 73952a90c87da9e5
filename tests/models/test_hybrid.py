"""Hybrid stacks: softmax-attention layers (full or in a sliding window) among a linear architecture's own."""

import pytest
import torch

from linlm import create_model, load
from linlm.cli import main
from linlm.errors import ConfigError
from linlm.layers.hybrid import HybridAttention, window_flops_factor
from linlm.models.counting import count
from linlm.models.model_config import ModelConfig
from linlm.models.presets import preset_config
from output_asserts import one_line_error

PATTERNS = [
    ("hgrn2", dict(n_layers=8, attn_layers=[3, 7])),
    ("mamba2", dict(n_layers=8, attn_every=8)),
    ("gla", dict(n_layers=4, attn_every=2, attn_window=5)),
    ("retnet", dict(n_layers=3, attn_layers=[0], attn_window=1)),
    ("mamba", dict(n_layers=2, attn_layers=[1], attn_window=7)),
]


def _model(arch, **kw):
    torch.manual_seed(0)
    return create_model(arch, preset="tiny", **kw).eval()


@pytest.mark.parametrize("arch, kw", PATTERNS, ids=[a for a, _ in PATTERNS])
def test_prefill_then_steps_equal_the_full_pass(arch, kw):
    model = _model(arch, **kw)
    kinds = [type(layer.mixer) is HybridAttention for layer in model.layers]
    assert [i for i, a in enumerate(kinds) if a] == list(model.config.attention_layers)
    ids = torch.randint(0, 512, (2, 24))
    with torch.no_grad():
        full = model(ids)
        logits, state = model.prefill(ids[:, :9])
        got = [logits]
        for t in range(9, 23):
            assert state.nbytes() == model.state_nbytes(2, t)  # the spec says what the state holds
            logits, state = model.step(ids[:, t], state)
            got.append(logits)
    torch.testing.assert_close(torch.stack(got, 1), full[:, 8:23], rtol=1e-4, atol=1e-4)


def test_packed_documents_equal_each_alone_in_a_window():
    model = _model("gla", n_layers=2, attn_layers=[1], attn_window=4)
    a, b = torch.randint(0, 512, (1, 7)), torch.randint(0, 512, (1, 9))
    reset = torch.zeros(1, 16, dtype=torch.bool)
    reset[0, [0, 7]] = True
    with torch.no_grad():
        packed = model(torch.cat([a, b], 1), reset=reset)
        torch.testing.assert_close(packed[:, :7], model(a), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed[:, 7:], model(b), rtol=1e-5, atol=1e-5)


def test_a_window_covering_the_sequence_is_full_attention_and_a_short_one_is_not():
    full = _model("hgrn2", n_layers=2, attn_layers=[0])
    ids = torch.randint(0, 512, (2, 20))
    with torch.no_grad():
        want = full(ids)
        for window, same in ((20, True), (64, True), (19, False)):
            windowed = create_model("hgrn2", preset="tiny", n_layers=2, attn_layers=[0], attn_window=window).eval()
            windowed.load_state_dict(full.state_dict())
            got = windowed(ids)
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5) == same, window


def test_a_windowed_cache_is_bounded_by_its_window_and_a_full_one_grows():
    windowed = _model("mamba2", n_layers=2, attn_layers=[1], attn_window=16)
    full = _model("mamba2", n_layers=2, attn_layers=[1])
    linear = _model("mamba2", n_layers=2)
    kv = 2 * 2 * 32 * 4  # k and v: 2 heads x 32 channels, float32, per position and row
    ssd = linear.state_nbytes(1, 1) // 2  # one Mamba-2 layer's constant state
    assert windowed.state_nbytes(1, 10_000) == windowed.state_nbytes(1, 15) == ssd + 15 * kv
    assert windowed.state_nbytes(1, 10) == ssd + 10 * kv
    assert full.state_nbytes(1, 10_000) == ssd + 10_000 * kv
    assert full.config.growing_state and not windowed.config.growing_state
    with torch.no_grad():
        _, state = windowed.prefill(torch.randint(0, 512, (1, 40)))
    assert state.layers[1][0].shape[2] == 15 and state.nbytes() == windowed.state_nbytes(1, 40)


def test_counts_follow_the_pattern():
    base = preset_config("hgrn2", "tiny", n_layers=4)
    hybrid = base.replace(attn_layers=[1, 3])
    windowed = base.replace(attn_layers=[1, 3], attn_window=8)
    d, n = 64, 256
    b, h, w = count(base, 1, n), count(hybrid, 1, n), count(windowed, 1, n)
    # An attention layer swaps HGRN2's mixer (3 d^2 + d^2 projections) for q, k, v, o (4 d^2): the same parameters.
    assert h["non_embedding_params"] == b["non_embedding_params"]
    # Attention's scores over (n + 1) / 2 keys on average, against sum min(t, 8) / n in a window of 8.
    assert window_flops_factor(n, None) == (n + 1) / 2
    assert window_flops_factor(n, 8) == pytest.approx((36 + (n - 8) * 8) / n)
    per_layer = 4 * d * ((n + 1) / 2 - window_flops_factor(n, 8))
    assert h["forward_flops_per_token"] - w["forward_flops_per_token"] == pytest.approx(2 * per_layer)
    assert h["flops_per_step_source"] == "counted from layer shapes"  # HGRN2's paper formula has no attention


@pytest.mark.parametrize("attn_options", [None, dict(head_dim=24, n_kv_heads=1, qk_norm=True, output_gate=True,
                                                   rope_fraction=0.5, rope_theta=1e6)])
def test_save_load_and_transformers_classes_keep_the_pattern(tmp_path, attn_options):
    pytest.importorskip("transformers")
    from linlm.hf.modeling import from_hf, to_hf

    model = _model("gla", n_layers=3, attn_layers=[2], attn_window=6, attn_options=attn_options)
    ids = torch.randint(0, 512, (1, 15))
    model.save(tmp_path / "m")
    back = load(tmp_path / "m")
    assert back.config.attention_layers == (2,) and back.config.attn_window == 6
    assert back.config.attn_options == model.config.attn_options
    to_hf(model).save_pretrained(tmp_path / "hf")
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(ids), model(ids), rtol=0, atol=0)
        torch.testing.assert_close(hf(ids).logits, model(ids), rtol=0, atol=0)
        torch.testing.assert_close(from_hf(hf)(ids), model(ids), rtol=0, atol=0)


@pytest.mark.parametrize("override, needle", [
    (dict(attn_layers=[3, 8]), "attn_layers: layer 8 is past the model's depth n_layers=8"),
    (dict(attn_every=9), "attn_every: 9 is past the model's depth n_layers=8"),
    (dict(attn_layers=[1], attn_window=0), "attn_window: must be a positive number of tokens"),
    (dict(attn_layers=[1], attn_window=-4), "attn_window: must be a positive number of tokens"),
    (dict(attn_window=16), "attn_window: is set but the model has no attention layers"),
    (dict(attn_layers=[1], attn_every=2), "attn_layers: give the attention layers as attn_layers or as attn_every"),
])
def test_bad_patterns_are_refused_when_the_config_loads(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        ModelConfig.from_dict({"arch": "hgrn2", "n_layers": 8, **override})


def test_llama_takes_no_pattern_and_the_cli_says_so_in_one_line(capsys):
    with pytest.raises(ConfigError, match="attn_layers: arch 'llama' is attention at every layer already"):
        ModelConfig.from_dict({"arch": "llama", "attn_layers": [0]})
    assert main(["count", "--arch", "mamba2", "--preset", "tiny", "--set", "model.overrides.attn_layers=[0,5]"]) == 2
    one_line_error(capsys.readouterr().err, "attn_layers: layer 5 is past the model's depth n_layers=2")
    assert main(["count", "--arch", "mamba2", "--preset", "tiny", "--set", "model.overrides.attn_layers=[1]",
                 "--set", "model.overrides.attn_window=0"]) == 2
    one_line_error(capsys.readouterr().err, "attn_window: must be a positive number of tokens")


def test_linlm_check_checks_hybrids_and_refuses_a_bad_pattern(capsys):
    assert main(["check", "--archs", "gla,mamba2", "--attn-every", "2", "--attn-window", "8"]) == 0
    out = capsys.readouterr().out
    assert "incremental decoding matches the full pass for every architecture" in out and "gla" in out
    assert main(["check", "--archs", "gla", "--attn-every", "9"]) == 2
    one_line_error(capsys.readouterr().err, "attn_every: 9 is past the model's depth n_layers=2")
