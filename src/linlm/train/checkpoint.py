"""Training checkpoints: atomic, checksummed directories, never pickle.

A checkpoint is ``<out_dir>/checkpoints/step_00000100/`` holding:

=========================  ================================================================================
``model.safetensors``      model weights (full, unsharded; FSDP runs gather them on rank 0 first)
``config.json``            the model config in the format of ``linlm.load`` (a checkpoint is a saved model)
``optimizer.safetensors``  AdamW tensors, keyed ``state/<param name>/<exp_avg|exp_avg_sq|step>``
``rng.safetensors``        torch CPU (and CUDA) generator states
``state.json``             step, scheduler position, optimizer hyper-parameters and groups, python and numpy
                           RNG states, the data position (``Batches.state_dict()``), counters
``train_config.yaml``      the run's TrainConfig
``tokenizer.json``         the tokenizer (with ``tokenizer_config.json``)
``manifest.json``          sha256 and size of every file above; written last
=========================  ================================================================================

Writing: everything goes into a temporary directory beside the final one, each file is fsynced and recorded as
linlm's (:mod:`linlm.outputs`), then the directory is renamed into place (and its parent fsynced). A crash at any
moment leaves either the complete new checkpoint or none; temporary directories left by a crash are removed by the
next run. Old checkpoints beyond ``keep`` are removed only after the new one is in place, and only what linlm
wrote in them (one holding a file of the user's is kept).

Kept checkpoints (``checkpoint.keep_log`` / ``keep_every_tokens``, for evaluation along training) become
**model-only** once they fall out of the newest ``keep``: the optimizer and RNG files are dropped (AdamW's two
moments are twice the weights, so a kept point costs a third of a full checkpoint) and the manifest says
``"model_only": true``. The directory is rebuilt beside the old one (its files hard-linked, not copied) and swapped
into place, so a crash leaves either the full checkpoint or the model-only one. A model-only checkpoint loads as a
model (``linlm.load``, ``--init-from``, ``linlm scaling evaluate``) but never resumes a run.

Reading: :func:`latest_valid` verifies the manifest of the newest full checkpoint (every file present, same size,
same sha256; model-only ones are passed over, not suspected); a corrupt one is reported with a warning naming it,
renamed aside (``*.corrupt``) and the previous one is tried.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from linlm import outputs
from linlm.errors import CheckpointError, LinlmError
from linlm.io_utils import MANIFEST, file_digests, verify_manifest
from linlm.models.format import CONFIG as MODEL_CONFIG_FILE
from linlm.models.format import WEIGHTS as MODEL_WEIGHTS
from linlm.models.format import write_model_files

log = logging.getLogger("linlm.train")

FORMAT = "linlm-train-checkpoint"
FORMAT_VERSION = 1
OPTIM_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"
STATE_FILE = "state.json"
CHECKPOINT_CONFIG_FILE = "train_config.yaml"
REQUIRED = (MODEL_WEIGHTS, MODEL_CONFIG_FILE, OPTIM_FILE, RNG_FILE, STATE_FILE, CHECKPOINT_CONFIG_FILE)
MODEL_ONLY_DROPS = (OPTIM_FILE, RNG_FILE)  # what a kept checkpoint sheds when it becomes model-only
MODEL_ONLY_REQUIRED = tuple(n for n in REQUIRED if n not in MODEL_ONLY_DROPS)
_NAME = re.compile(r"^step_(\d{8})$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def checkpoint_step(path: str | Path) -> Optional[int]:
    """The step of a checkpoint directory named by :func:`checkpoint_name`, None for any other name."""
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else None


@dataclass
class Checkpoint:
    path: Path
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]  # the FQN-keyed optimizer state dict (torch.distributed.checkpoint format)
    rng: dict[str, Any]
    state: dict[str, Any]
    config_yaml: str


# ---- optimizer state <-> safetensors + JSON ----------------------------------------------------------------


def _json_safe(value: Any, where: str) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, torch.Tensor):
        raise CheckpointError(f"{where}: unexpected tensor in the optimizer's hyper-parameters")
    return value


def split_optimizer_state(osd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """A FQN-keyed optimizer state dict -> (tensors for safetensors, JSON-able rest)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for name, entry in osd.get("state", {}).items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state/{name}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(name, {})[key] = _json_safe(value, f"state[{name}][{key}]")
    groups = [{k: _json_safe(v, f"param_groups[{i}][{k}]") for k, v in g.items()}
              for i, g in enumerate(osd.get("param_groups", []))]
    return tensors, {"scalars": scalars, "param_groups": groups}


def join_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, rest = key.split("/", 1)
        name, field = rest.rsplit("/", 1)
        state.setdefault(name, {})[field] = value
    for name, entry in meta.get("scalars", {}).items():
        state.setdefault(name, {}).update(entry)
    groups = []
    for g in meta.get("param_groups", []):
        g = dict(g)
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


# ---- RNG --------------------------------------------------------------------------------------------------


def capture_rng() -> tuple[dict[str, torch.Tensor], dict]:
    import random

    import numpy as np

    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    version, state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    rest = {"python": [version, list(state), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    return tensors, rest


def restore_rng(tensors: dict[str, torch.Tensor], rest: dict) -> None:
    import random

    import numpy as np

    torch.set_rng_state(tensors["torch_cpu"])
    cuda = sorted((k for k in tensors if k.startswith("torch_cuda_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    if cuda and torch.cuda.is_available():
        states = [tensors[k] for k in cuda][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)
    version, state, gauss = rest["python"]
    random.setstate((version, tuple(state), gauss))
    kind, keys, pos, has_gauss, cached = rest["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


# ---- writing ----------------------------------------------------------------------------------------------


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(outputs.dumps(obj))


def save_checkpoint(root: str | Path, step: int, *, model_state: dict[str, torch.Tensor], model_config: dict,
                    optimizer_state: dict, state: dict, config_yaml: str, tokenizer_dir: Optional[Path] = None,
                    keep: int = 3, protect: frozenset = frozenset()) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically, then prune to the newest ``keep`` (a step in
    ``protect``, a kept point of :func:`kept_steps`, is never pruned).

    A failure (disk full, permission denied, ...) removes the partial temporary directory, leaves every earlier
    checkpoint untouched, and raises CheckpointError.
    """
    root = Path(root)
    final = root / checkpoint_name(step)
    tmp: Optional[Path] = None
    try:
        tmp = outputs.temp_dir_beside(final)
        write_model_files(tmp, model_state, model_config)
        opt_tensors, opt_meta = split_optimizer_state(optimizer_state)
        save_file(opt_tensors, str(tmp / OPTIM_FILE), metadata={"format": FORMAT})
        rng_tensors, rng_rest = capture_rng()
        save_file(rng_tensors, str(tmp / RNG_FILE), metadata={"format": FORMAT})
        _write_json(tmp / STATE_FILE, {"format": FORMAT, "format_version": FORMAT_VERSION, "step": step,
                                       **state, "optimizer": opt_meta, "rng": rng_rest})
        (tmp / CHECKPOINT_CONFIG_FILE).write_text(config_yaml, encoding="utf-8")
        if tokenizer_dir is not None:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copyfile(Path(tokenizer_dir) / name, tmp / name)
        digests = file_digests(tmp)
        _write_json(tmp / MANIFEST, {"format": FORMAT, "step": step, "files": digests})
        # A checkpoint of this step from an earlier attempt is replaced; files of the user's in it are kept aside.
        outputs.commit_dir(tmp, final, digests={k: v["sha256"] for k, v in digests.items()})
        tmp = None
    except CheckpointError:
        raise
    except (OSError, SafetensorError, RuntimeError, ValueError, LinlmError) as e:
        previous = [p.name for _, p in list_checkpoints(root) if p != final] if root.is_dir() else []
        kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointError(
            f"could not write checkpoint {final} ({type(e).__name__}: {e}); {kept}. Free disk space or fix the "
            f"permissions of {root}, then continue with: linlm train --resume --out {root.parent}") from e
    finally:
        if tmp is not None:
            outputs.discard(tmp)
    prune(root, keep, protect)
    return final


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every finished checkpoint directory under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        step = checkpoint_step(p)
        if step is not None and p.is_dir():
            out.append((step, p))
    return sorted(out)


def kept_steps(steps: int, tokens_per_step: int, every_tokens: int = 0, log_points: int = 0) -> frozenset:
    """The steps whose checkpoints a run keeps for evaluation along training (downstream scores against compute),
    beyond the newest ``keep``:

    - ``every_tokens`` > 0: for k = 1, 2, ..., the first step by which k x every_tokens tokens were trained,
      ceil(k every_tokens / tokens_per_step), up to ``steps``;
    - ``log_points`` > 0: that many steps spaced evenly in log(step) from 1 to ``steps``,
      round(steps ** (i / (log_points - 1))) for i = 0..log_points-1 (duplicates at small steps merge; one point is
      the last step).
    """
    out: set[int] = set()
    if every_tokens > 0:
        k = 1
        while k * every_tokens <= steps * tokens_per_step:
            out.add(-(-k * every_tokens // tokens_per_step))
            k += 1
    if log_points == 1:
        out.add(steps)
    elif log_points > 1:
        out.update(max(1, round(steps ** (i / (log_points - 1)))) for i in range(log_points))
    return frozenset(s for s in out if 1 <= s <= steps)


def prune(root: str | Path, keep: int, protect: frozenset = frozenset()) -> None:
    """Remove all but the newest ``keep`` checkpoints and those of the steps in ``protect``, which become
    model-only (:func:`strip_to_model`). A checkpoint holding anything linlm did not write (or a file changed since)
    is kept whole, with a warning: its files are the user's as much as linlm's."""
    for step, path in list_checkpoints(root)[:-keep]:
        if step in protect:
            if not is_model_only(path):
                strip_to_model(path)
            continue
        foreign = outputs.foreign_entries(path)
        if foreign:
            log.warning("checkpoint %s is past keep=%d but holds files linlm did not write (%s); it is kept",
                        path, keep, outputs.shown(foreign))
            continue
        trash = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
        os.replace(path, trash)  # a half-deleted directory never looks like a checkpoint
        outputs.remove_tree(trash, "checkpoint", keep_root=False)


def is_model_only(path: str | Path) -> bool:
    """Whether the checkpoint at ``path`` is a model-only one (its manifest says so)."""
    try:
        return json.loads((Path(path) / MANIFEST).read_text()).get("model_only") is True
    except (OSError, ValueError, AttributeError):
        return False


def strip_to_model(path: Path) -> bool:
    """Make the kept checkpoint at ``path`` model-only (see the module doc); return whether it did. One that does
    not verify, or holds anything linlm did not write, is left whole with a warning."""
    foreign = outputs.foreign_entries(path)
    if foreign:  # checked first: it reads no file whole, and prune asks again at every save
        log.warning("kept checkpoint %s holds files linlm did not write (%s); it is kept whole, optimizer state "
                    "included", path, outputs.shown(foreign))
        return False
    try:
        verify(path)
    except CheckpointError as e:
        log.warning("kept checkpoint %s is left as it is (%s)", path, e)
        return False
    manifest = json.loads((path / MANIFEST).read_text())
    tmp: Optional[Path] = outputs.temp_dir_beside(path)
    try:
        for name in manifest["files"]:
            if name in MODEL_ONLY_DROPS:
                continue
            try:
                os.link(path / name, tmp / name)
            except OSError:  # a file system without hard links
                shutil.copyfile(path / name, tmp / name)
        digests = {k: v for k, v in manifest["files"].items() if k not in MODEL_ONLY_DROPS}
        _write_json(tmp / MANIFEST, {**{k: v for k, v in manifest.items() if k != "files"}, "model_only": True,
                                     "files": digests})
        outputs.commit_dir(tmp, path, digests={k: v["sha256"] for k, v in digests.items()})
        tmp = None
    except OSError as e:
        log.warning("kept checkpoint %s could not be made model-only (%s); it is kept whole", path, e)
        return False
    finally:
        if tmp is not None:
            outputs.discard(tmp)
    return True


def clean_temporaries(root: str | Path) -> None:
    """Remove temporary directories a crashed writer left behind (never a finished checkpoint; files of the
    user's in one stay, with it)."""
    root = Path(root)
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(".step_") and p.name.endswith(".tmp"):
            outputs.discard(p)
        elif p.is_dir() and p.name.startswith(".step_") and p.name.endswith(".old"):
            outputs.remove_tree(p, "checkpoint", keep_root=False)


# ---- reading ----------------------------------------------------------------------------------------------


def verify(path: str | Path, *, model_only_ok: bool = False) -> None:
    """Raise CheckpointError unless every file of the manifest is present with its size and sha256. A model-only
    checkpoint passes only with ``model_only_ok`` (to be read as a model, never resumed)."""
    if not is_model_only(path):
        verify_manifest(path, REQUIRED)
    elif model_only_ok:
        verify_manifest(path, MODEL_ONLY_REQUIRED)
    else:
        raise CheckpointError(f"{path}: a model-only checkpoint (kept for evaluation along training: weights without "
                              "optimizer state); it loads as a model, but a run resumes only from a full one")


def scan(root: str | Path) -> tuple[Optional[Path], list[tuple[Path, str]]]:
    """(the newest checkpoint under ``root`` that verifies, or None; the newer ones that failed, with why)."""
    corrupt = []
    for _, path in reversed(list_checkpoints(root)):
        if is_model_only(path):  # kept for evaluation: nothing to resume from, and nothing wrong with it
            continue
        try:
            verify(path)
            return path, corrupt
        except CheckpointError as e:
            corrupt.append((path, str(e)))
    return None, corrupt


def set_aside(path: Path) -> Path:
    """Rename a corrupt checkpoint aside (``*.corrupt``) so that it is never tried again."""
    aside = path.with_name(f"{path.name}.corrupt")
    n = 1
    while os.path.lexists(aside):  # an older one set aside before: never replaced
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{n}")
    os.replace(path, aside)
    return aside


def latest_valid(root: str | Path, *, quarantine: bool = True,
                 warn: Callable[[str], None] = log.warning) -> Optional[Path]:
    """The newest checkpoint under ``root`` that verifies; corrupt newer ones are reported (and renamed aside)."""
    found, corrupt = scan(root)
    for path, why in corrupt:
        msg = f"checkpoint {path} is corrupt and is skipped: {why}"
        if quarantine:
            msg += f" (moved to {set_aside(path).name})"
        warn(msg)
    return found


def read_state(path: str | Path) -> dict:
    """A checkpoint's state.json ({} when unreadable)."""
    try:
        state = json.loads((Path(path) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def resolve_checkpoint(path: str | Path, *, quarantine: bool = False) -> Path:
    """A checkpoint directory, a ``checkpoints/`` directory or a run directory -> a verified checkpoint."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path}: does not exist; pass a run directory or one of its checkpoints")
    if (path / MANIFEST).is_file() or _NAME.match(path.name):
        verify(path, model_only_ok=True)
        return path
    for root in (path / "checkpoints", path):
        if list_checkpoints(root):
            found = latest_valid(root, quarantine=quarantine)
            if found is None:
                raise CheckpointError(f"{root}: every checkpoint failed verification (see the warnings above)")
            return found
    raise CheckpointError(f"{path}: holds no checkpoint (expected step_XXXXXXXX directories or a {MANIFEST})")


def load_model_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights of the (verified) checkpoint at ``path``, full or model-only."""
    try:
        return load_file(str(Path(path) / MODEL_WEIGHTS))
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{path}: cannot be read ({e}); it is corrupt") from None


def load_checkpoint(path: str | Path, *, verified: bool = False) -> Checkpoint:
    path = Path(path)
    if not verified or is_model_only(path):
        verify(path)
    try:
        state = json.loads((path / STATE_FILE).read_text())
        model = load_file(str(path / MODEL_WEIGHTS))
        opt_tensors = load_file(str(path / OPTIM_FILE))
        rng_tensors = load_file(str(path / RNG_FILE))
        config_yaml = (path / CHECKPOINT_CONFIG_FILE).read_text(encoding="utf-8")
    except (OSError, ValueError, SafetensorError) as e:
        raise CheckpointError(f"{path}: cannot be read ({e}); it is corrupt") from None
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path / STATE_FILE}: not a linlm training checkpoint")
    optimizer = join_optimizer_state(opt_tensors, state.pop("optimizer"))
    rng_rest = state.pop("rng")
    return Checkpoint(path=path, step=int(state["step"]), model=model, optimizer=optimizer,
                      rng={"tensors": rng_tensors, "rest": rng_rest}, state=state, config_yaml=config_yaml)
