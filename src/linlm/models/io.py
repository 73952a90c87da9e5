"""Saving and loading models. The format itself (files, checksums, the refusal rules for saving) is in
models/format.py; this module adds :func:`load`, which builds the model and so sits above models/lm.py."""

from __future__ import annotations

from pathlib import Path

import torch

from linlm.errors import CheckpointError
from linlm.io_utils import MANIFEST, verify_manifest
from linlm.layers.shell import meta_device
from linlm.models.format import (CONFIG, FORMAT, FORMAT_VERSION, MODEL_FILES, WEIGHTS, config_checksum,  # noqa: F401
                                 load_weights, read_config, save_model, write_model_files)
from linlm.models.lm import CausalLM
from linlm.models.quant import quantized_shell


def load(path, device: str | torch.device = "cpu") -> CausalLM:
    """Restore a model saved with ``model.save(path)``, or the model of a training checkpoint directory.

    Every checksum is verified first: a training checkpoint's manifest (every file it lists, config.json
    included), the model config's own ``config_sha256`` and the weights' sha256. Any mismatch is a CheckpointError.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: does not exist; pass a directory written by model.save()")
    if (path / MANIFEST).is_file():
        verify_manifest(path, required=MODEL_FILES)
    cfg, meta = read_config(path)
    quantization = meta.get("quantization")

    def prepare(model):  # a quantized model's int8 modules in place of its float ones
        return model if quantization is None else quantized_shell(model, quantization)

    with meta_device():
        shell = prepare(CausalLM(cfg))
    expected = shell.state_dict()
    tensors = load_weights(path, expected, meta.get("weights_sha256"))
    return assemble(shell, expected, tensors, prepare).to(device)


def assemble(shell: CausalLM, expected: dict, tensors: dict, prepare=lambda model: model) -> CausalLM:
    """The model of ``shell`` (built on the meta device, then ``prepare``d) holding ``tensors``: they become its
    parameters, so that loading holds the weights once (building a model first would initialise a second copy, and
    its random init costs as long as reading the file). A model with buffers that are not saved (TNL's decays) is
    built for real instead, to compute them, and the tensors are copied in; so is one with tensors held as plain
    attributes (LLaMA's rescaled RoPE frequencies)."""
    if any(name not in expected for name, _ in shell.named_buffers()) or any(
            isinstance(v, torch.Tensor) for m in shell.modules() for v in vars(m).values()):
        model = prepare(CausalLM(shell.config))
        model.load_state_dict(tensors, strict=True)
        return model
    tensors = {k: t if t.dtype == expected[k].dtype else t.to(expected[k].dtype) for k, t in tensors.items()}
    shell.load_state_dict(tensors, strict=True, assign=True)
    return shell
