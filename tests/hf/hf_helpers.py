"""What the transformers tests share: tiny linlm models with their weights moved off their symmetric inits."""

import torch

from linlm import create_model


def tiny(arch, **kw):
    """A seeded tiny model of ``arch`` (``kw``: ModelConfig overrides) whose norms and gates are not at their
    initial values, in eval mode."""
    torch.manual_seed(0)
    model = create_model(arch, preset="tiny", **kw).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model
