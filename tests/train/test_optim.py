"""Learning-rate schedules at chosen steps, and the decay / no-decay parameter groups."""

from __future__ import annotations

import math

import pytest
import torch

from linlm import create_model
from linlm.train.train_config import OptimSection, ScheduleSection
from linlm.train.optim import build_optimizer, lr_at, split_decay, wsd_decay_start


def sched(kind, warmup=10, min_ratio=0.1, decay_fraction=0.2):
    return ScheduleSection(kind=kind, warmup_steps=warmup, min_lr_ratio=min_ratio, decay_fraction=decay_fraction)


def test_warmup_is_linear_from_the_first_step():
    s = sched("cosine", warmup=10)
    assert lr_at(0, 1.0, 100, s) == pytest.approx(0.1)
    assert lr_at(4, 1.0, 100, s) == pytest.approx(0.5)
    assert lr_at(9, 1.0, 100, s) == pytest.approx(1.0)


def test_cosine_values():
    s = sched("cosine", warmup=10, min_ratio=0.1)
    assert lr_at(10, 2.0, 110, s) == pytest.approx(2.0)
    # halfway through the decay (steps 10..109): cos(pi/2) = 0 -> midpoint of max and min
    mid = 10 + (109 - 10) / 2
    assert lr_at(int(mid), 2.0, 110, s) == pytest.approx(0.2 + 1.8 * 0.5 * (1 + math.cos(math.pi * (49 / 99))))
    assert lr_at(109, 2.0, 110, s) == pytest.approx(0.2)
    values = [lr_at(i, 2.0, 110, s) for i in range(10, 110)]
    assert all(a >= b for a, b in zip(values, values[1:])), "cosine decay must be monotone"


def test_constant_after_warmup():
    s = sched("constant", warmup=5)
    assert lr_at(2, 1.0, 50, s) == pytest.approx(0.6)
    assert [lr_at(i, 1.0, 50, s) for i in (5, 20, 49)] == [1.0, 1.0, 1.0]


def test_wsd_stable_then_linear_decay():
    s = sched("wsd", warmup=10, min_ratio=0.0, decay_fraction=0.2)
    steps = 100
    start = wsd_decay_start(steps, 0.2)
    assert start == 80
    assert lr_at(9, 1.0, steps, s) == pytest.approx(1.0)
    assert lr_at(50, 1.0, steps, s) == pytest.approx(1.0)
    assert lr_at(80, 1.0, steps, s) == pytest.approx(1.0)
    assert lr_at(99, 1.0, steps, s) == pytest.approx(0.0)
    # linear in between: step 80 + 19/2 is the midpoint of 80..99
    assert lr_at(89, 1.0, steps, s) == pytest.approx(1 - 9 / 19)
    assert lr_at(90, 1.0, steps, s) - lr_at(91, 1.0, steps, s) == pytest.approx(1 / 19)


def test_wsd_min_lr_ratio():
    s = sched("wsd", warmup=0, min_ratio=0.25, decay_fraction=0.5)
    assert lr_at(0, 4.0, 10, s) == pytest.approx(4.0)
    assert lr_at(9, 4.0, 10, s) == pytest.approx(1.0)


def names(pairs):
    return {n for n, _ in pairs}


@pytest.mark.parametrize("arch", ["llama", "hgrn2", "cosformer2", "tnl"])
def test_decay_groups(arch):
    model = create_model(arch, preset="tiny")
    decay, no_decay = split_decay(model)
    all_names = {n for n, p in model.named_parameters()}
    assert names(decay) | names(no_decay) == all_names
    assert not names(decay) & names(no_decay)
    assert "embed.weight" in names(no_decay)  # embeddings (and the tied head)
    for n, p in no_decay:
        assert p.dim() < 2 or not n.endswith(("qkv.weight", "out.weight")), n
    for n, p in decay:
        assert p.dim() >= 2, f"{n} is {p.dim()}-D but gets weight decay"
        assert "norm" not in n and "embed" not in n
    # Every token mixer's projections decay: each architecture has an output projection, most a fused qkv one.
    projections = {n for n in all_names if n.endswith(("mixer.qkv.weight", "mixer.out.weight"))}
    assert sum(n.endswith("mixer.out.weight") for n in projections) == model.config.n_layers
    assert projections <= names(decay), projections - names(decay)
    if arch == "hgrn2":
        assert any("table" in n for n in names(no_decay))


def test_biases_and_marked_parameters_get_no_decay():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    model[2].weight._no_weight_decay = True
    decay, no_decay = split_decay(model)
    assert names(decay) == {"0.weight"}
    assert names(no_decay) == {"0.bias", "1.weight", "1.bias", "2.weight", "2.bias"}


def test_optimizer_groups_carry_weight_decay():
    model = create_model("llama", preset="tiny")
    opt = build_optimizer(model, OptimSection(lr=1e-3, weight_decay=0.1))
    wd = {g["weight_decay"] for g in opt.param_groups}
    assert wd == {0.1, 0.0}
    decayed = next(g for g in opt.param_groups if g["weight_decay"] == 0.1)["params"]
    ids = {id(p) for p in decayed}
    assert id(model.embed.weight) not in ids
    assert id(model.layers[0].mixer.qkv.weight) in ids


def test_fused_adamw_where_it_takes_the_parameters():
    """Plain CPU parameters get torch's fused AdamW; it takes the same steps as the per-tensor loop (to float32
    rounding); parameters it cannot run (meta device, integer) keep the default."""
    from linlm.train.optim import fused_adamw_takes

    torch.manual_seed(0)
    model = create_model("tnl", n_layers=1, d_model=32, n_heads=2, vocab_size=64)
    opt = build_optimizer(model, OptimSection(lr=1e-2))
    assert all(g["fused"] for g in opt.param_groups)
    twin = create_model("tnl", n_layers=1, d_model=32, n_heads=2, vocab_size=64)
    twin.load_state_dict(model.state_dict())
    names = {id(p): n for n, p in model.named_parameters()}
    twin_params = dict(twin.named_parameters())
    loop = torch.optim.AdamW([{"params": [twin_params[names[id(p)]] for p in g["params"]],
                               "weight_decay": g["weight_decay"], "betas": g["betas"], "eps": g["eps"]}
                              for g in opt.param_groups], lr=1e-2, foreach=False)
    ids = torch.randint(0, 64, (2, 16))
    for _ in range(3):  # the same gradients into both (Adam's normalisation would amplify any drift between models)
        opt.zero_grad()
        model(ids, targets=ids).loss.backward()
        for name, p in model.named_parameters():
            twin_params[name].grad = p.grad.clone()
        opt.step()
        loop.step()
        for name, p in model.named_parameters():
            torch.testing.assert_close(p, twin_params[name], rtol=1e-5, atol=1e-6)
            twin_params[name].data.copy_(p.data)
    assert not fused_adamw_takes([torch.nn.Parameter(torch.zeros(2, device="meta"))])
    assert not fused_adamw_takes([torch.zeros(2, dtype=torch.int64)])
    assert not fused_adamw_takes([])


@pytest.mark.parametrize("kind", ["wsd", "cosine", "constant"])
@pytest.mark.parametrize("warmup", [0, 1, 3, 100])
@pytest.mark.parametrize("decay_fraction", [0.1, 0.3, 1.0])
def test_every_short_run_reaches_the_asked_lr(kind, warmup, decay_fraction):
    """Every length from 1 to 10: the run reaches base_lr and never exceeds it, warms up monotonically, then never
    rises, stays at or above the floor, and a decaying schedule ends at the floor when it has a step to decay in.
    (A WSD decay one step long used to put every step before it at the floor: 3 steps at min_lr throughout.)"""
    base, ratio = 0.0123, 0.05
    s = sched(kind, warmup=warmup, min_ratio=ratio, decay_fraction=decay_fraction)
    for steps in range(1, 11):
        lrs = [lr_at(i, base, steps, s) for i in range(steps)]
        peak = lrs.index(max(lrs))
        assert max(lrs) == pytest.approx(base), (steps, lrs)
        assert all(a <= b + 1e-15 for a, b in zip(lrs[:peak], lrs[1:peak + 1])), (steps, lrs)
        assert all(a >= b - 1e-15 for a, b in zip(lrs[peak:], lrs[peak + 1:])), (steps, lrs)
        assert min(lrs[peak:]) >= base * ratio - 1e-15
        if kind != "constant" and steps >= 2:
            assert lrs[-1] == pytest.approx(base * ratio), (steps, lrs)


def test_the_issue_example_trains_at_the_asked_lr():
    s = sched("wsd", warmup=0, min_ratio=0.05, decay_fraction=0.3)
    assert [lr_at(i, 0.0123, 3, s) for i in range(3)] == pytest.approx([0.0123, 0.0123, 0.000615])
