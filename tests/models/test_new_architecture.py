"""docs/code-layout.md's "Adding an architecture", followed to the letter with a toy architecture: a mixer derived
from TokenMixer, an ArchSpec, and one register() line; the toy is then seen everywhere.

The toy mixes tokens with a running mean per channel: h_t = a_c h_(t-1) + (1 - a_c) x_t (h restarts at a document
start), y_t = W h_t. The per-channel decays a_c = decay^(1 + c/d) are computed, not learned (a non-persistent buffer
that init_buffers() fills), and ``decay`` is an option of its own, so that its options travel as the built-in
ones do.
"""

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

import linlm
from linlm.cli import main
from linlm.schema import config_error
from linlm.layers.mixer import TokenMixer, float32_at_least, meta
from linlm.models.archs.base import ArchSpec, sglu
from linlm.models.lm import create_model
from linlm.models.registry import ARCHITECTURES, arch_color, arch_names

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@dataclass(frozen=True)
class ToyOptions:
    decay: float = 0.5

    def validate(self) -> None:
        if not 0 <= self.decay < 1:
            raise config_error("options.decay", f"must be in [0, 1), got {self.decay}")


# Step 1 (layers/NAME.py): the token mixer.
class ToyMixer(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.base, self.d_model = cfg.options.decay, cfg.d_model
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.register_buffer("decay", torch.empty(cfg.d_model), persistent=False)  # filled by init_buffers

    def init_buffers(self) -> None:
        c = torch.arange(self.d_model, dtype=torch.float32, device=self.decay.device)
        with torch.no_grad():
            self.decay.copy_(self.base ** (1 + c / self.d_model))

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        h = x.new_zeros(x.shape[0], x.shape[2], dtype=self.decay.dtype) if state is None else state
        ys = []
        for t in range(x.shape[1]):
            if reset is not None:
                h = torch.where(reset[:, t, None], torch.zeros_like(h), h)
            h = self.decay * h + (1 - self.decay) * x[:, t]
            ys.append(h)
        return self.out(torch.stack(ys, dim=1).to(x.dtype)), (h if return_state else None)

    def state_spec(self, batch, context, dtype):
        return meta(batch, self.d_model, dtype=float32_at_least(dtype))

    def mixing_flops_per_token(self, seq_len):
        return 3.0 * self.d_model  # a h, (1 - a) x and their sum; the output projection is an nn.Linear


# Step 2 (models/archs/NAME.py): its ArchSpec.
TOY = ArchSpec("toy", ToyMixer, sglu, "srms", "Toy: a running mean of the past tokens", color="tab:olive",
               scaling_study=True, options=ToyOptions, flat_options={"toy_decay": "decay"},
               saved_before={"decay": 0.25})


@pytest.fixture
def toy():
    """Step 3 (models/registry.py): its register() line, for this test only."""
    assert "toy" not in ARCHITECTURES
    linlm.register(TOY)
    yield TOY
    del ARCHITECTURES["toy"]


def _hand_count(cfg) -> float:
    """Forward FLOPs per token of the toy's body, by hand: per layer the mixer's output projection (2 d^2) and its
    recurrence (3 d), the SGLU's two projections (2 d 2h + 2 h d); norms and the embeddings count nothing."""
    d, h = cfg.d_model, cfg.glu_hidden
    return cfg.n_layers * (2.0 * d * d + 3.0 * d + 2.0 * d * 2 * h + 2.0 * h * d)


def test_the_toy_is_counted_by_its_flop_hook(toy, capsys):
    assert main(["count", "--arch", "toy", "--preset", "tiny", "--json"]) == 0
    counted = json.loads(capsys.readouterr().out)
    cfg = create_model("toy", preset="tiny").config
    assert counted["forward_flops_per_token"] == _hand_count(cfg) == 2 * (2 * 64 * 64 + 3 * 64 + 6 * 64 * 128)
    assert counted["counted_flops_per_token"] == 3 * _hand_count(cfg)
    assert counted["flops_per_step_source"] == "counted from layer shapes"  # no paper formula: C is the count


def test_the_toy_decodes_as_one_full_pass(toy):
    """prefill + steps give the full pass's logits, the state is what state_spec says, and the decays are the
    computed ones (a model built on the meta device and materialised gets them from init_buffers)."""
    model = create_model("toy", preset="tiny", options={"decay": 0.8}).eval()
    ids = torch.randint(0, 512, (2, 11))
    with torch.no_grad():
        full = model(ids)
        logits, state = model.prefill(ids[:, :6])
        steps = [logits]
        for t in range(6, 11):
            logits, state = model.step(ids[:, t], state)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, dim=1), full[:, 5:], rtol=0, atol=1e-5)
    assert state.nbytes() == model.state_nbytes(2, 11) == 2 * 2 * 64 * 4
    want = 0.8 ** (1 + torch.arange(64) / 64)
    torch.testing.assert_close(model.layers[1].mixer.decay, want, rtol=0, atol=0)
    with torch.device("meta"):
        shell = create_model("toy", preset="tiny", options={"decay": 0.8})
    shell = shell.to_empty(device="cpu")
    shell.init_buffers()
    assert torch.equal(shell.layers[0].mixer.decay, model.layers[0].mixer.decay)


def test_the_toy_is_listed_counted_and_checked(toy, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one table row per architecture
    assert main(["archs"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if " toy " in line)
    assert "Toy: a running mean of the past tokens" in row and TOY.family in row
    assert main(["count", "--arch", "toy", "--preset", "tiny", "--json"]) == 0
    counted = json.loads(capsys.readouterr().out)
    assert counted["arch"] == "toy" and counted["config"]["options"] == {"decay": 0.5}
    model = create_model("toy", preset="tiny")
    assert counted["total_params"] == sum(p.numel() for p in model.parameters())
    # `linlm check` with its default (every architecture) builds the toy and checks its decoding.
    from linlm.commands.check import run_check

    rows = {r["arch"]: r for r in run_check()}
    assert list(rows) == arch_names() and "toy" in rows
    assert rows["toy"]["max_logit_diff"] < 1e-5 and rows["toy"]["state_bytes"] == 64 * 4 * 2  # 2 layers of [1, 64]
    assert main(["check", "--archs", "toy"]) == 0
    assert "toy" in capsys.readouterr().out


def test_the_toy_options_are_read_validated_and_saved(toy, tmp_path):
    import linlm
    from linlm.models.model_config import ModelConfig

    model = create_model("toy", preset="tiny", options={"decay": 0.9})
    assert model.layers[0].mixer.base == 0.9 and float(model.layers[0].mixer.decay[0]) == pytest.approx(0.9)
    assert create_model("toy", preset="tiny", toy_decay=0.8).config.options == ToyOptions(0.8)  # its flat spelling
    with pytest.raises(linlm.errors.ConfigError, match=r"^toy_decay: must be in \[0, 1\), got 1.5$"):
        create_model("toy", toy_decay=1.5)
    with pytest.raises(linlm.errors.ConfigError, match=r"^options.decay: must be in \[0, 1\), got 1.5$"):
        create_model("toy", options={"decay": 1.5})
    model.save(tmp_path / "m")
    ids = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        assert torch.equal(linlm.load(tmp_path / "m")(ids), model(ids))
    # A config saved before the option existed reads back with the value of then.
    data = {k: v for k, v in model.config.to_dict().items() if k != "options"}
    assert ModelConfig.from_saved(data).options == ToyOptions(0.25)


def test_the_toy_has_transformers_classes(toy, tmp_path):
    transformers = pytest.importorskip("transformers")
    from linlm.hf.configuration import CONFIG_CLASSES
    from linlm.hf.modeling import MODEL_CLASSES, to_hf

    assert "toy" in MODEL_CLASSES and "toy" in CONFIG_CLASSES and "toy" in list(MODEL_CLASSES)
    model = create_model("toy", preset="tiny", options={"decay": 0.75}).eval()
    to_hf(model).save_pretrained(tmp_path / "hf")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(back) is MODEL_CLASSES["toy"] and type(back).__name__ == "LinlmToyForCausalLM"
    assert back.model.config.options == ToyOptions(0.75)
    # The computed decays are in no weights file: transformers' wrapper recomputes them (init_buffers).
    assert "model.layers.0.mixer.decay" not in back.state_dict()
    assert torch.equal(back.model.layers[1].mixer.decay, model.layers[1].mixer.decay)
    ids = torch.randint(0, 512, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids), rtol=0, atol=0)


def test_the_toy_is_on_the_scaling_ladders_and_in_the_plots(toy, tmp_path):
    from linlm.scaling.ladder import ladder_from_dict, load_ladder, plan_runs

    assert "toy" in load_ladder("cpu").archs and "toy" not in load_ladder("smoke").archs  # smoke pins the four
    ladder = ladder_from_dict({"rungs": [{"name": "xs", "model": {"n_layers": 1, "d_model": 16, "n_heads": 1},
                                          "tokens": 4096}],
                               "train": {"data": {"seq_len": 32}, "batch_size": 4}}, "toy-ladder", "test")
    assert ladder.archs == arch_names(scaling_study=True) and ladder.archs[-1] == "toy"
    runs = {r.name: r for r in plan_runs(ladder, None, tmp_path)}
    assert "toy-xs" in runs and runs["toy-xs"].config.model.arch == "toy" and runs["toy-xs"].params > 0
    assert arch_color("toy") == "tab:olive"


def test_the_toy_is_in_the_eval_and_profile_defaults(toy):
    from linlm.experiments.mqar import default_archs as mqar_archs
    from linlm.infer.cli import profile_archs

    assert profile_archs(None) == arch_names() and "toy" in profile_archs(None)
    assert "toy" in mqar_archs() and "mossnet" not in mqar_archs()  # MossNet's runs are --experts'
    assert profile_archs("tnl, llama") == ["tnl", "llama"]


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"_registry_test_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["bench_decode", "bench_eval", "bench_resets", "bench_train_step"])
def test_the_toy_is_in_the_benchmark_defaults(toy, name, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option in --help
    monkeypatch.setattr(sys, "path", list(sys.path))  # the scripts put benchmarks/ on it
    bench = _bench(name)
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    archs_help = text[text.index("\n  --archs"):].split("\n  --")[1]  # up to the next option
    assert "toy" in archs_help and "mossnet" in archs_help
    if name == "bench_decode":
        assert "toy" in bench.constant_state_archs() and "llama" not in bench.constant_state_archs()
