"""The attention layer's later variants (LLaMA's options head_dim, qk_norm, output_gate, rope_fraction; a hybrid's
attn_options): each against a float64 reference written from the equations in layers/attention.py's docstring,
decoding from the cache against the full pass, and bad settings refused in one line naming the key."""

from __future__ import annotations

import math

import pytest
import torch

from linlm import create_model
from linlm.errors import ConfigError

F64 = torch.float64


def reference_attention(mixer, x):
    """The layer from its equations, in float64 (the RoPE angles apart): projections, per-head RMSNorms of q and k,
    RoPE on the first ``rotary`` channels (rotate-half pairs i and i + rotary / 2, frequency theta^(-2i / rotary)),
    causal softmax
    attention with query head h reading key/value head h // (H / Hkv), the sigmoid gate, the output projection."""
    B, T, _ = x.shape
    H, Hkv, Dh, rot = mixer.n_heads, mixer.n_kv_heads, mixer.head_dim, mixer.rotary
    z = x @ mixer.qkv.weight.T
    widths = [H * Dh] * (2 if mixer.gated else 1) + [Hkv * Dh, Hkv * Dh]
    parts = list(z.split(widths, dim=-1))
    q, gate = parts[0], (parts[1] if mixer.gated else None)
    k, v = parts[-2], parts[-1]
    q, k, v = q.view(B, T, H, Dh), k.view(B, T, Hkv, Dh), v.view(B, T, Hkv, Dh)
    if mixer.q_norm is not None:
        norm = lambda t, m: t / (t.pow(2).mean(-1, keepdim=True) + m.eps).sqrt() * m.weight  # noqa: E731
        q, k = norm(q, mixer.q_norm), norm(k, mixer.k_norm)
    # The angles in float32, as linlm (and transformers) compute them whatever the model's dtype.
    freq = 1.0 / mixer.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    angles = torch.arange(T, dtype=torch.float32)[:, None] * freq
    cos, sin = angles.cos().to(F64)[None, :, None], angles.sin().to(F64)[None, :, None]

    def rope(t):
        a, b, rest = t[..., : rot // 2], t[..., rot // 2: rot], t[..., rot:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1)

    q, k = rope(q), rope(k)
    out = torch.zeros(B, T, H, Dh, dtype=F64)
    for h in range(H):
        g = h // (H // Hkv)
        scores = torch.einsum("btd,bsd->bts", q[:, :, h], k[:, :, g]) / math.sqrt(Dh)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        out[:, :, h] = scores.softmax(-1) @ v[:, :, g]
    out = out.reshape(B, T, H * Dh)
    if gate is not None:
        out = out * torch.sigmoid(gate)
    return out @ mixer.out.weight.T


VARIANTS = {
    "plain": {},
    "wide_heads_gqa": dict(head_dim=24, n_kv_heads=1),
    "qk_norm": dict(qk_norm=True),
    "gate_partial_rope": dict(output_gate=True, rope_fraction=0.25, rope_theta=1e6),
    "qwen3_next": dict(head_dim=24, n_kv_heads=1, qk_norm=True, output_gate=True, rope_fraction=0.5),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_llama_attention_variants_match_the_equations(name):
    torch.manual_seed(0)
    model = create_model("llama", preset="tiny", options=VARIANTS[name]).double()
    mixer = model.layers[0].mixer
    with torch.no_grad():  # norm weights away from 1, so that a skipped norm shows up
        for m in (mixer.q_norm, mixer.k_norm):
            if m is not None:
                m.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 21, model.config.d_model, dtype=F64)
    y, _ = mixer(x)
    torch.testing.assert_close(y, reference_attention(mixer, x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("window", [None, 6])
def test_a_hybrid_with_qwen3_next_attention_decodes_as_its_full_pass(window):
    torch.manual_seed(1)
    model = create_model("gated_deltanet", preset="tiny", attn_layers=[1], attn_window=window,
                         attn_options=VARIANTS["qwen3_next"]).double().eval()
    assert model.layers[1].mixer.gated and model.layers[1].mixer.rotary == 12
    ids = torch.randint(0, 512, (2, 30))
    with torch.no_grad():
        full = model(ids)
        logits, state = model.prefill(ids[:, :9])
        pieces = [logits.reshape(2, 1, -1)]
        for t in range(9, 29):
            logits, state = model.step(ids[:, t], state)
            pieces.append(logits.reshape(2, 1, -1))
    torch.testing.assert_close(torch.cat(pieces, 1), full[:, 8:29], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("options, needle", [
    (dict(head_dim=-1), r"^attn_options.head_dim: must be >= 0"),
    (dict(rope_fraction=0.0), r"^attn_options.rope_fraction: must be in \(0, 1\]"),
    (dict(rope_fraction=0.01), r"^attn_options.rope_fraction: turns 0 of each head's 32 channels"),
    (dict(n_kv_heads=3), r"^attn_options.n_kv_heads: 3 must divide n_heads=2"),
    (dict(gate=True), r"^attn_options.gate: unknown key 'gate'"),
])
def test_bad_attention_options_are_refused_naming_the_key(options, needle):
    with pytest.raises(ConfigError, match=needle):
        create_model("gated_deltanet", preset="tiny", attn_layers=[1], attn_options=options)


def test_attention_options_need_attention_layers():
    with pytest.raises(ConfigError, match=r"^attn_options: is set but the model has no attention layers"):
        create_model("gated_deltanet", preset="tiny", attn_options={"qk_norm": True})
