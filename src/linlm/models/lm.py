"""One generic causal language model for every architecture in the registry.

Block lives in models/block.py and is imported here under its old name."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from linlm.errors import ConfigError, ShapeError
from linlm.layers.linear import decode_linears, linear
from linlm.layers.mixer import buffers_without_init, init_buffers
from linlm.layers.norm import make_norm
from linlm.layers.state import ModelState
from linlm.models.block import Block
from linlm.models.model_config import ModelConfig
from linlm.models.format import save_model
from linlm.models.fused_step import fused_step, model_takes
from linlm.models.presets import preset_config
from linlm.models.quant import head_logits, prefill_tokens
from linlm.models.registry import get_arch
from linlm.ops.fused import linear_cross_entropy


# Config fields and options a decoding state does not depend on; every other one must match between a state and its
# model.
_STATE_FREE_FIELDS = frozenset({
    "vocab_size", "glu_dim", "max_seq_len", "norm_eps", "init_std", "tie_embeddings", "chunk_size",
    "mlp_experts", "mlp_top_k", "mlp_expert_dim", "shared_experts", "balance_loss_coef", "router_z_loss_coef",
})


# Tokens per forward pass of a prefill (CausalLM.prefill).
PREFILL_CHUNK = 256


@dataclass
class LMOutput:
    # None when the model was called with targets: the loss is then computed without materialising the logits.
    logits: Optional[torch.Tensor]
    state: Optional[ModelState] = None
    # Sum of the routers' auxiliary losses (already weighted by their coefficients); 0 for dense models.
    aux_loss: Optional[torch.Tensor] = None
    # Mean next-token cross-entropy over the targets that are not ignore_index (float32), when targets were given.
    loss: Optional[torch.Tensor] = None


class CausalLM(nn.Module):
    """Embeddings, a stack of blocks, a final norm and a head (tied to the embeddings unless
    ``config.tie_embeddings`` is False).

    ``model(input_ids)`` returns logits [B, T, V]. With ``return_state=True`` or ``return_aux=True`` it
    returns an :class:`LMOutput`. Pass the returned ``state`` back in to continue a sequence: a prompt
    prefilled in one call and then extended token by token gives the logits of one full pass.

    ``model(input_ids, targets=targets)`` (targets [B, T], already shifted: targets[:, t] is the token after
    input_ids[:, t]; ``ignore_index`` marks tokens left out) returns an :class:`LMOutput` whose ``loss`` is the mean
    cross-entropy, computed by ``ops.fused.linear_cross_entropy`` in chunks of tokens, so that the [B, T, V] logits
    are never held at once (``logits`` is then None). This is the training path.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        config.validate()
        self.config = config
        spec = get_arch(config.arch)
        self.spec = spec
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d)
        self.embed_mixer = spec.embed_mixer(config) if spec.embed_mixer is not None else None
        self.shared = spec.shared(config) if spec.shared is not None else None
        self.layers = nn.ModuleList(Block(config, i, spec) for i in range(config.n_layers))
        self.norm = make_norm(spec.norm_kind(config), d, config.norm_eps)
        # None when the head is tied to the embeddings (the default): see head_weight.
        self.head = None if config.tie_embeddings else nn.Linear(d, config.vocab_size, bias=False)
        decode_linears(self)  # a decoding step's matrix-vector products on linlm's kernel (layers/linear.py)
        self.reset_parameters()
        unset = buffers_without_init(self)
        if unset:
            raise ConfigError(f"arch {config.arch!r}: {', '.join(unset)} is a computed buffer (persistent=False) that "
                              "no init_buffers() computes, so a model loaded from the meta device would hold "
                              "garbage there; define init_buffers() on its module (see linlm.layers.mixer)")
        self.init_buffers()
        self._compiled_step = None  # compile_step()

    def init_buffers(self) -> None:
        """(Re)compute every computed (non-persistent) buffer: each module's ``init_buffers()``. The transformers
        wrapper calls it after materialising a model from the meta device."""
        for module in self.children():
            init_buffers(module)

    def reset_parameters(self) -> None:
        std = self.config.init_std
        for module in self.modules():
            # On the meta device (counting, a model about to be loaded) there is nothing to fill, and meta's
            # normal_ runs a Python decomposition: 3 ms a weight, most of a dry run's time.
            if isinstance(module, (nn.Linear, nn.Embedding)) and not module.weight.is_meta:
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head [V, d]: the embeddings when tied, else the head's own weight."""
        return self.embed.weight if self.head is None else self.head.weight

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states h [..., d]: h @ head_weight^T, or the int8 head of a quantized model."""
        quantized = head_logits(self, h)
        return linear(h, self.head_weight) if quantized is None else quantized

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def _check_ids(self, name: str, ids: torch.Tensor, hint: str) -> None:
        """Every id in ``ids`` must be a row of the vocabulary (one min/max pass)."""
        V = self.config.vocab_size
        if not ids.numel() or ids.device.type == "meta":
            return
        lo, hi = (int(v) for v in torch.aminmax(ids))
        if lo < 0 or hi >= V:
            raise ShapeError(
                f"{name} holds token id {hi if hi >= V else lo}, outside the model's vocabulary (vocab_size={V}, "
                f"valid ids 0..{V - 1}); {hint}"
            )

    def _check_input(self, input_ids: torch.Tensor, state: Optional[ModelState], reset, targets=None,
                     ignore_index: int = -100) -> None:
        cfg = self.config
        if input_ids.dim() != 2:
            raise ShapeError(f"input_ids must have shape [batch, time], got {tuple(input_ids.shape)}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise ShapeError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
        self._check_ids("input_ids", input_ids, "use a tokenizer that fits or build the model with a larger vocab_size")
        if targets is not None:
            if tuple(targets.shape) != tuple(input_ids.shape):
                raise ShapeError(f"targets must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(targets.shape)}")
            # Ignored positions count as id 0, so that one min/max pass checks the rest.
            self._check_ids("targets", torch.where(targets == ignore_index, 0, targets),
                            f"mark tokens to leave out with ignore_index={ignore_index}")
        if targets is not None and (targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool):
            raise ShapeError(f"targets must be integer token ids (the next token at each position), got dtype "
                             f"{targets.dtype}; pass the shifted input_ids, not probabilities")
        B, T = input_ids.shape
        if B == 0 or T == 0:
            raise ShapeError(f"input_ids of shape {tuple(input_ids.shape)} hold no tokens; pass at least one sequence "
                             "of at least one token (a prompt for prefill, one token per sequence for step)")
        if state is not None:
            self._check_state(state, B)
        offset = state.offset if state is not None else 0
        if isinstance(offset, torch.Tensor):
            if not cfg.per_row_positions:
                raise ShapeError(f"this {cfg.arch} model's state holds sequences of different lengths; its KV cache "
                                 "needs one length per batch: step such sequences separately")
            offset = int(offset.max())
        if self.spec.position_limit and offset + input_ids.shape[1] > cfg.max_seq_len:
            raise ShapeError(
                f"input of {offset + input_ids.shape[1]} tokens is longer than max_seq_len={cfg.max_seq_len} of this "
                f"{cfg.arch} model; shorten the input or build the model with a larger max_seq_len"
            )
        if reset is not None and tuple(reset.shape) != tuple(input_ids.shape):
            raise ShapeError(f"reset must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(reset.shape)}")

    def state_signature(self) -> dict[str, Any]:
        """The config a decoding state belongs to (stored in every state this model returns): every field except
        those that cannot change a state's meaning or shape (initialisation, loss weights, vocabulary, limits)."""
        cached = getattr(self, "_signature", None)
        if cached is None or cached[0] is not self.config:
            sig = {k: v for k, v in self.config.to_dict().items() if k not in _STATE_FREE_FIELDS}
            sig["options"] = {k: v for k, v in sig["options"].items() if k not in _STATE_FREE_FIELDS}
            cached = self._signature = (self.config, sig)
        return cached[1]

    def _check_state(self, state, batch: int) -> None:
        """A decoding state must come from a model of this architecture and shape, for the same batch."""
        if not isinstance(state, ModelState):
            raise ShapeError(f"state must be the ModelState returned by model(..., return_state=True), prefill() or "
                             f"step(), got {type(state).__name__}; pass state=None to start a new sequence")
        mine = self.state_signature()
        if state.signature is not None and state.signature != mine:
            diff = sorted(k for k in set(mine) | set(state.signature) if state.signature.get(k) != mine.get(k))
            if "arch" in diff and "options" in diff:  # each architecture has its own options: arch says it
                diff.remove("options")
            theirs = ", ".join(f"{k}={state.signature.get(k)!r}" for k in diff)
            ours = ", ".join(f"{k}={mine.get(k)!r}" for k in diff)
            raise ShapeError(f"state comes from another model ({theirs}) than this one ({ours}); pass a state made by "
                             f"this model, or state=None to start over")
        if len(state.layers) != self.config.n_layers:
            raise ShapeError(f"state holds {len(state.layers)} layers, this {self.config.arch} model has "
                             f"n_layers={self.config.n_layers}; pass a state made by this model")
        if state.batch_size is not None and state.batch_size != batch:
            raise ShapeError(f"state is for a batch of {state.batch_size} sequences, input_ids have {batch}; "
                             f"feed one row per sequence of the state (or start over with state=None)")

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        state: Optional[ModelState] = None,
        reset: Optional[torch.Tensor] = None,
        return_state: bool = False,
        return_aux: bool = False,
        targets: Optional[torch.Tensor] = None,
        ignore_index: int = -100,
        logits_to_keep: int = 0,
        logits_at: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        apply_head: bool = True,
    ):
        """input_ids [B, T]; reset [B, T] bool marks the first token of each packed document.

        ``logits_to_keep=k`` > 0 computes the logits of the last k positions only ([B, k, V]): a prefill needs one,
        and the [B, T, V] logits of a long prompt would dwarf the model. ``logits_at=(rows, positions)`` (two
        LongTensors [N]) computes the logits of those N (row, position) pairs only ([N, V]): a scorer reads a few
        scattered positions of right-padded rows, and the head is the costliest layer of a small model.
        ``apply_head=False`` returns the final-normed hidden states of those positions ([.., d_model]) in place of
        the logits, for a caller that applies ``head_weight`` itself (a chunk at a time, as the scorer does)."""
        if not torch.compiler.is_exporting():  # the checks read values; linlm.infer.export checks before tracing
            self._check_input(input_ids, state, reset, targets, ignore_index)
        offset = state.offset if state is not None else 0
        h, layer_states, extra, aux_total = self._body(
            input_ids, None if state is None else state.layers, {} if state is None else state.extra, offset, reset,
            return_state)
        loss = logits = None
        if targets is not None:
            loss = linear_cross_entropy(h.flatten(0, 1), self.head_weight, targets.flatten(), ignore_index)
        else:
            if logits_at is not None:
                h = h[logits_at[0], logits_at[1]]
            elif logits_to_keep > 0:
                h = h[:, -logits_to_keep:]
            logits = (self._head(h) if apply_head else h)
            if not (return_state or return_aux):
                return logits
        new_state = (ModelState(layer_states, offset + input_ids.shape[1], extra, self.state_signature())
                     if return_state else None)
        if aux_total is None:
            aux_total = h.new_zeros((), dtype=torch.float32)
        return LMOutput(logits, new_state, aux_total, loss)

    def state_spec(self, batch: int, context: int, dtype: Optional[torch.dtype] = None) -> ModelState:
        """The decoding state after ``context`` tokens of ``batch`` sequences, as meta tensors (shapes and dtypes,
        no memory): what prefill returns for a [batch, context] prompt, from each mixer's ``state_spec``. ``dtype``
        is the compute dtype (default: the embeddings')."""
        dtype = self.embed.weight.dtype if dtype is None else dtype
        extra = {}
        if self.embed_mixer is not None:
            extra["embed"] = self.embed_mixer.state_spec(batch, context, dtype)
        layers = [layer.mixer.state_spec(batch, context, dtype) for layer in self.layers]
        return ModelState(layers, context, extra, self.state_signature())

    def state_nbytes(self, batch: int, context: int, dtype: Optional[torch.dtype] = None) -> int:
        """Bytes of the decoding state after ``context`` tokens (:meth:`state_spec`), computed without running."""
        return self.state_spec(batch, context, dtype).nbytes()

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, chunk: Optional[int] = None) -> tuple[torch.Tensor, ModelState]:
        """Run a prompt; return the logits of its last position [B, V] and the state to continue from.

        The prompt goes through in pieces of ``chunk`` tokens, each continuing the state of the one before (0: in
        one piece): the activations of a piece are what the prefill holds, so its memory does not grow with the
        prompt. At 2,048 tokens of a Mamba of mamba-130m's shape (1 thread) one piece made the process's resident
        set grow by 470 MB (the allocator keeps the freed activations of every layer) and pieces of 256 by 96 MB,
        at 6 % less speed (benchmarks/bench_llamacpp.py measures the prefill). The default is PREFILL_CHUNK, and
        for an int8 model pieces of :func:`~linlm.models.quant.prefill_tokens`, whose products take the int8 kernel
        (see there)."""
        if chunk is None:
            chunk = prefill_tokens(self, input_ids.shape[0] if input_ids.dim() == 2 else 1) or PREFILL_CHUNK
        T = input_ids.shape[-1] if input_ids.dim() == 2 else 0
        if chunk <= 0 or T <= chunk:
            out = self(input_ids, return_state=True, logits_to_keep=1)
            return out.logits[:, -1], out.state
        state = None
        for start in range(0, T, chunk):
            out = self(input_ids[:, start:start + chunk], state=state, return_state=True, logits_to_keep=1)
            state = out.state
        return out.logits[:, -1], state

    @torch.no_grad()
    def step(self, token_ids: torch.Tensor, state: ModelState) -> tuple[torch.Tensor, ModelState]:
        """Feed one token per sequence ([B] ids); return its logits [B, V] and the advanced state."""
        ids = token_ids.view(-1, 1)
        if self._compiled_step is not None and isinstance(state, ModelState) and isinstance(state.offset, int):
            self._check_input(ids, state, None)
            try:
                logits, layers, extra = self._compiled_step(ids, state.layers, state.extra, state.offset)
                return logits, ModelState(layers, state.offset + 1, extra, self.state_signature())
            except Exception as e:  # torch.compile could not build this step: the eager one computes the same
                self._compiled_step = None
                warnings.warn(f"the compiled decoding step failed ({type(e).__name__}: {str(e).splitlines()[0][:200]});"
                              f" decoding eagerly from here on", RuntimeWarning, stacklevel=2)
        if isinstance(state, ModelState) and not torch.compiler.is_compiling() and model_takes(self):
            self._check_input(ids, state, None)
            fused = fused_step(self, ids, state)  # a Mamba's whole step in one kernel call, where it takes it
            if fused is not None:
                return fused[0], ModelState(fused[1], state.offset + 1, state.extra, self.state_signature())
        out = self(ids, state=state, return_state=True)
        return out.logits[:, -1], out.state

    def compile_step(self, enable: bool = True) -> bool:
        """Decode through ``torch.compile`` (``enable``), or through the eager step again. Returns whether
        :meth:`step` is now compiled: only where the decoding state keeps its shape (no KV cache, so no hybrid
        attention layer), since a state that grows would compile again at every step.

        The compiled step runs the same modules as the eager one, from the embeddings to the logits, as one graph:
        the element-wise work between the matrix products is fused and the Python between them is gone. At batch 1
        that is the time a decoding step spends beside reading the weights (benchmarks/bench_llamacpp.py times
        both). The first step compiles (tens of seconds on two cores; torch caches the result on disk); each new
        batch size compiles again. Input checks stay eager; a state with one offset per row (continuous batching)
        takes the eager step, and so does every step after one that torch.compile could not build (with a
        warning that names the failure)."""
        self._compiled_step = None
        if not enable or not self.spec.constant_state or self.config.attention_layers:
            return False
        self._compiled_step = torch.compile(self._step_graph, fullgraph=True, dynamic=False)
        return True

    @property
    def step_compiled(self) -> bool:
        """Whether :meth:`step` decodes through the compiled step now (False again after a compile that failed)."""
        return self._compiled_step is not None

    def _body(self, input_ids, layers: Optional[list], extra: dict, offset, reset, return_state: bool):
        """Embeddings, every layer and the final norm: (h [B, T, d], the layers' new states, the new extra states,
        the summed auxiliary loss or None). ``layers`` None starts from no state."""
        x = self.embed(input_ids)
        new_extra: dict[str, Any] = {}
        if self.embed_mixer is not None:
            x, new_extra["embed"] = self.embed_mixer(x, state=extra.get("embed"), reset=reset, offset=offset,
                                                     return_state=return_state)
        ctx = self.shared() if self.shared is not None else None
        new_layers = []
        aux_total = None
        for i, layer in enumerate(self.layers):
            prev = layers[i] if layers is not None else None
            x, s, aux = layer(x, state=prev, reset=reset, offset=offset, return_state=return_state, ctx=ctx)
            new_layers.append(s)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
        return self.norm(x), new_layers, new_extra, aux_total

    def _step_graph(self, ids: torch.Tensor, layers: list, extra: dict, offset: int):
        """One token per row: the logits and new states that forward(ids, state=..., return_state=True) gives, as a
        function of the state's tensors alone (the part :meth:`compile_step` compiles)."""
        h, new_layers, new_extra, _ = self._body(ids, layers, extra, offset, None, True)
        return self._head(h)[:, -1], new_layers, new_extra

    def num_parameters(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if not non_embedding:
            return n
        return n - self.embed.weight.numel() - (self.head.weight.numel() if self.head is not None else 0)

    def save(self, path, *, overwrite: bool = False) -> Path:
        """Save as a directory (models/format.py): a new path, an empty directory, or with ``overwrite=True`` a
        saved model's directory holding nothing else. Anything else is refused and left untouched."""
        return save_model(self, path, overwrite=overwrite)


def create_model(arch: str = "llama", preset: Optional[str] = None, **overrides: Any) -> CausalLM:
    """Build a model: ``create_model("tnl", preset="paper-70m", vocab_size=8192)``."""
    return CausalLM(preset_config(arch, preset, **overrides))
