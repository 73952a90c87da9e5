"""``nn.Module``s: the token-mixer contract (mixer.py), norms, GLUs, attention, one token mixer per architecture, the
MoE MLP, the decoding state."""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "TokenMixer": "linlm.layers.mixer", "ModelState": "linlm.layers.state",
})
