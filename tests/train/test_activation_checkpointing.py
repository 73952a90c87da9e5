"""Activation checkpointing: the wrapped blocks compute what the plain ones do, keep their names in every state
dict, and a checkpoint written with it on resumes with it off (and the other way round) to the same weights as a
run that never changed it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from train_helpers import assert_bitwise_equal, final_weights

from linlm import create_model
from linlm.models.registry import ARCHITECTURES
from linlm.train import TrainHooks, latest_valid, train
from linlm.train.train_config import OptimSection
from linlm.train.metrics import read_metrics
from linlm.train.optim import build_optimizer
from linlm.train.step import apply_activation_checkpointing

WRAPPED = "_checkpoint_wrapped_module."  # the wrapper's own level in the module tree


def _pair(arch: str):
    torch.manual_seed(0)
    plain = create_model(arch, preset="tiny").train()
    wrapped = copy.deepcopy(plain)
    apply_activation_checkpointing(wrapped)
    return plain, wrapped


def _batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 37), generator=g)
    targets = torch.randint(0, vocab, (2, 37), generator=g)
    targets[0, :3] = -100
    reset = torch.zeros(2, 37, dtype=torch.bool)
    reset[:, 0] = reset[1, 20] = True  # a packed second document in row 1
    return ids, targets, reset


def test_every_block_is_wrapped_once_and_recomputed_in_the_backward_pass():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    plain, wrapped = _pair("llama")
    apply_activation_checkpointing(wrapped)  # a second call wraps nothing twice
    inner = [b._checkpoint_wrapped_module for b in wrapped.layers]
    assert len(inner) == len(plain.layers) and all(type(b) is CheckpointWrapper for b in wrapped.layers)
    assert not any(isinstance(b, CheckpointWrapper) or "forward" in vars(b) for b in inner)  # nothing patched
    assert all(b.checkpoint_fn.func is torch.utils.checkpoint.checkpoint
               and b.checkpoint_fn.keywords == {"use_reentrant": False} for b in wrapped.layers)
    calls = {"plain": 0, "wrapped": 0}
    for name, blocks in (("plain", plain.layers), ("wrapped", inner)):
        for block in blocks:
            # a pre-hook: the recomputation stops as soon as it has what the backward needs, so a block's
            # post-hooks may not run again
            block.register_forward_pre_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    ids, targets, _ = _batch(plain.config.vocab_size)
    for model in (plain, wrapped):
        model(ids, targets=targets).loss.backward()
    n = len(plain.layers)
    assert calls == {"plain": n, "wrapped": 2 * n}  # each wrapped block runs again for its backward


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_loss_and_gradients_equal_the_unwrapped_model(arch):
    plain, wrapped = _pair(arch)
    ids, targets, reset = _batch(plain.config.vocab_size)
    results = []
    for model in (plain, wrapped):
        out = model(ids, targets=targets, reset=reset, return_aux=True)
        (out.loss + out.aux_loss).backward()
        grads = {name.replace(WRAPPED, ""): p.grad for name, p in model.named_parameters()}
        results.append((out.loss.detach(), out.aux_loss.detach(), grads))
    (loss_a, aux_a, grads_a), (loss_b, aux_b, grads_b) = results
    assert torch.isfinite(loss_a) and torch.equal(loss_a, loss_b) and torch.equal(aux_a, aux_b)
    assert grads_a.keys() == grads_b.keys() and all(g is not None for g in grads_a.values())
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), f"gradient of {name} differs"
    with torch.no_grad():  # evaluation runs the wrapped blocks without recording anything
        torch.testing.assert_close(wrapped(ids), plain(ids), rtol=0, atol=0)


def _flat(state: dict, prefix: str = "") -> dict:
    """A nested state dict as {dotted key: value}."""
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _trained(model):
    opt = build_optimizer(model, OptimSection())
    ids, targets, _ = _batch(model.config.vocab_size)
    model(ids, targets=targets).loss.backward()
    opt.step()
    return opt


@pytest.mark.parametrize("arch", ["llama", "mossnet"])
def test_state_dicts_keep_the_unwrapped_keys_and_load_across(arch):
    """Module and optimizer state dicts (nn.Module's, and torch.distributed.checkpoint's, which the trainer saves
    and restores) have the unwrapped model's keys, and each loads into a fresh model of the other kind."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    plain, wrapped = _pair(arch)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    saved = {"plain": get_state_dict(plain, _trained(plain)), "wrapped": get_state_dict(wrapped, _trained(wrapped))}
    (model_a, optim_a), (model_b, optim_b) = saved["plain"], saved["wrapped"]
    assert list(model_a) == list(model_b) and not any(WRAPPED in k for k in _flat(optim_b))
    assert list(optim_a["state"]) == list(optim_b["state"]) and optim_a["param_groups"] == optim_b["param_groups"]
    assert_bitwise_equal(model_a, model_b)
    assert_bitwise_equal(_flat(optim_a["state"]), _flat(optim_b["state"]))
    for source, wrap in (("wrapped", False), ("plain", True)):
        torch.manual_seed(7)  # other initial weights, so that the load has something to change
        fresh = create_model(arch, preset="tiny").train()
        if wrap:
            apply_activation_checkpointing(fresh)
        opt = build_optimizer(fresh, OptimSection())
        model_sd, optim_sd = saved[source]
        set_state_dict(fresh, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
        got_model, got_optim = get_state_dict(fresh, opt)
        assert_bitwise_equal(got_model, model_sd)
        assert_bitwise_equal(_flat(got_optim["state"]), _flat(optim_sd["state"]))
        fresh.load_state_dict(plain.state_dict(), strict=True)  # the nn.Module path takes the same keys


class _StopAt(TrainHooks):
    """Interrupt the run in-process after ``step`` (before that step's checkpoint)."""

    def __init__(self, step: int):
        self.step = step

    def on_step(self, record: dict) -> None:
        if record["step"] == self.step:
            raise KeyboardInterrupt


@pytest.mark.parametrize("first, then", [(True, False), (False, True)], ids=["on-then-off", "off-then-on"])
def test_a_checkpoint_resumes_with_activation_checkpointing_switched(make_config, first, then):
    """6 steps with a checkpoint every 2: interrupted after step 3, resumed from step 2 with the switch flipped.
    The loss curve and the final weights equal those of a run that kept the resumed setting throughout."""
    settings = dict(steps=6, eval__every=0, checkpoint__every=2)
    reference = train(make_config("ref", activation_checkpointing=then, **settings), verbose=False)
    run = make_config("run", activation_checkpointing=first, **settings)
    with pytest.raises(KeyboardInterrupt):
        train(run, verbose=False, hooks=_StopAt(3))
    assert latest_valid(Path(run.out_dir) / "checkpoints", quarantine=False).name == "step_00000002"
    resumed = make_config("run", activation_checkpointing=then, **settings)
    result = train(resumed, resume=True, verbose=False)
    assert result.finished and result.step == 6
    losses = [r["loss"] for r in read_metrics(reference.out_dir / "metrics.jsonl")]
    assert [r["loss"] for r in read_metrics(result.out_dir / "metrics.jsonl")] == losses and len(losses) == 6
    assert_bitwise_equal(final_weights(result.out_dir), final_weights(reference.out_dir))
