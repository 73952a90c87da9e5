"""``linlm quantize MODEL --to int8 --out DIR``: a saved model with 8-bit weights (linlm.models.quant), which every
command that loads a model (generate, eval, perplexity, profile --model, serve) takes as it is."""

from __future__ import annotations

from pathlib import Path

from linlm.errors import ConfigError
from linlm.models.quant import METHODS, is_quantized, quantize_model


def quantize(src, out, method: str = "int8", *, overwrite: bool = False) -> Path:
    """Quantize the model at ``src`` (a saved model, checkpoint or run directory) into a new model directory
    ``out``; the source's tokenizer files are copied beside it. A model that is already quantized is refused."""
    from linlm.data.tokenizer import SPECIAL_TOKENS_FILE, TOKENIZER_FILE, TRANSFORMERS_FILES
    from linlm.infer.generate import load_model
    from linlm.models.format import save_model

    if method not in METHODS:
        raise ConfigError(f"--to: {method!r} is not a quantization linlm has; valid choices are {', '.join(METHODS)}")
    model, model_dir = load_model(src)
    if is_quantized(model):
        raise ConfigError(f"{src}: is already quantized ({model.quantization['method']}); quantize the float model "
                          f"it was made from")
    quantize_model(model, method)
    names = dict.fromkeys((TOKENIZER_FILE, SPECIAL_TOKENS_FILE, *TRANSFORMERS_FILES))
    files = tuple(Path(model_dir) / n for n in names if (Path(model_dir) / n).is_file())
    return save_model(model, out, overwrite=overwrite, files=files)
