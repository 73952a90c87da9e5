"""What ``from_pretrained`` checks in the weights it loaded, beyond their names and shapes: that each tensor was
stored as floating point, and that the model holds no NaN or infinity.

transformers casts whatever the file holds into the model's dtype without a word: int32 weights (a file written by
a broken conversion) load as their integer values, and a NaN anywhere turns every logit into NaN. linlm's own
:func:`linlm.load` refuses a damaged file by its checksums; a transformers directory has none, so these are its
checks. Each failure is one CheckpointError naming the file and the tensor.
"""

from __future__ import annotations

from pathlib import Path

import torch

from linlm.errors import CheckpointError

FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the dtypes a weight may be stored in


def check_stored_dtypes(path) -> None:
    """Refuse a tensor of a ``*.safetensors`` file in the local directory ``path`` stored in a dtype that is not
    floating point (a hub name, or a directory without safetensors files, has nothing to read here)."""
    from safetensors import safe_open

    root = Path(path)
    if not root.is_dir():
        return
    for file in sorted(root.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                dtype = f.get_slice(name).get_dtype()
                if dtype not in FLOAT_DTYPES:
                    raise CheckpointError(f"{file}: tensor {name!r} is stored as {dtype}, not as floating point "
                                          f"({', '.join(FLOAT_DTYPES)}); the file was written wrongly. Convert the "
                                          "weights again from their source")


def check_finite(path, model: torch.nn.Module) -> None:
    """Refuse a loaded model with a NaN or an infinity in a parameter or buffer, naming the first one."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and tensor.device.type != "meta" and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(f"{path}: tensor {name!r} holds {bad:,} NaN or infinite values; the weights are "
                                  "damaged (a diverged run, or a broken conversion). Load a good checkpoint")
