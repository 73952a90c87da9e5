"""linlm models under transformers: Auto registration (explicit, by importing linlm.hf), save/load offline, generate() against linlm's own decoding,
left-padded batches, sampling, and clear errors."""

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from linlm.errors import CheckpointError, ShapeError  # noqa: E402
from linlm.hf.modeling import MODEL_CLASSES, LinlmCache, from_hf, to_hf  # noqa: E402
from linlm.infer.generate import generate_ids  # noqa: E402
from linlm.models.registry import ARCHITECTURES  # noqa: E402
from hf_helpers import tiny  # noqa: E402

ARCHS = sorted(ARCHITECTURES)


@pytest.mark.parametrize("arch", ARCHS)
def test_save_pretrained_then_auto_from_pretrained(arch, tmp_path):
    model = tiny(arch)
    to_hf(model).save_pretrained(tmp_path / "hf")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.model_type == f"linlm_{arch}"
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(back) is MODEL_CLASSES[arch]
    ids = torch.randint(0, 512, (2, 21))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids), rtol=0, atol=0)
    # And back to a linlm checkpoint.
    from_hf(back).save(tmp_path / "linlm")
    from linlm import load

    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "linlm")(ids), model(ids), rtol=0, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generate_equals_linlm_generation(arch):
    model = tiny(arch)
    hf = to_hf(model)
    prompt = torch.randint(0, 512, (1, 11))
    out = hf.generate(prompt, max_new_tokens=15, do_sample=False)
    assert out[0, 11:].tolist() == generate_ids(model, prompt[0].tolist(), 15, temperature=0, stop_at_eos=False)


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_batch_equals_each_prompt_alone(arch):
    hf = to_hf(tiny(arch))
    prompts = [torch.randint(1, 512, (n,)) for n in (13, 4, 8)]
    T = 13
    ids = torch.zeros(3, T, dtype=torch.long)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):], mask[i, T - len(p):] = p, 1
    batch = hf.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    for i, p in enumerate(prompts):
        alone = hf.generate(p[None], max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert batch[i, T:].tolist() == alone[0, len(p):].tolist(), f"row {i}"


def test_sampling_runs_through_the_cache_and_is_seeded():
    hf = to_hf(tiny("hgrn2"))
    prompt = torch.randint(0, 512, (2, 5))
    kw = dict(max_new_tokens=10, do_sample=True, temperature=0.9, top_k=50, top_p=0.9, pad_token_id=0)
    torch.manual_seed(1)
    a = hf.generate(prompt, **kw)
    torch.manual_seed(1)
    b = hf.generate(prompt, **kw)
    torch.manual_seed(2)
    c = hf.generate(prompt, **kw)
    assert torch.equal(a, b) and not torch.equal(a, c)
    out = hf(prompt, use_cache=True)
    assert isinstance(out.cache, LinlmCache) and out.cache.get_seq_length() == 5 and out.cache.nbytes() > 0


def test_forward_with_cache_matches_full_pass():
    hf = to_hf(tiny("mamba"))
    ids = torch.randint(0, 512, (2, 12))
    with torch.no_grad():
        full = hf(ids).logits
        first = hf(ids[:, :7], use_cache=True)
        rest = hf(ids[:, 7:], cache=first.cache, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), full, rtol=1e-4, atol=1e-5)


def test_labels_give_the_shifted_loss():
    hf = to_hf(tiny("tnl"))
    ids = torch.randint(0, 512, (2, 9))
    out = hf(ids, labels=ids)
    want = torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    torch.testing.assert_close(out.loss, want)


def test_from_pretrained_on_another_architecture_is_refused(tmp_path):
    to_hf(tiny("hgrn2")).save_pretrained(tmp_path / "hgrn2")
    with pytest.raises(CheckpointError, match=r"linlm 'hgrn2' model, but this class builds 'tnl'.*AutoModelForCausalLM"):
        MODEL_CLASSES["tnl"].from_pretrained(tmp_path / "hgrn2")


def test_from_pretrained_on_a_plain_llama_dir_is_refused(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    with pytest.raises(CheckpointError, match=r"no linlm model config.*from_hf_llama"):
        MODEL_CLASSES["llama"].from_pretrained(tmp_path / "llama")


def test_right_padding_is_refused():
    hf = to_hf(tiny("tnl"))
    ids = torch.randint(1, 512, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    with pytest.raises(ShapeError, match=r"left padding only.*padding_side = 'left'"):
        hf(ids, attention_mask=mask)


def test_import_linlm_stays_cheap_and_installs_no_import_hook():
    code = ("import sys; hooks = list(sys.meta_path); import linlm;"
            "assert 'transformers' not in sys.modules, 'imported transformers';"
            "assert not any(m.startswith('linlm.hf') for m in sys.modules), 'imported linlm.hf';"
            "assert sys.meta_path == hooks, 'changed sys.meta_path'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok"]


def test_import_linlm_hf_registers_with_the_auto_classes(tmp_path):
    """A fresh process: ``import linlm.hf`` is what a program does before transformers' Auto classes load a linlm
    directory (and without it transformers does not know linlm_<arch>)."""
    to_hf(tiny("tnl")).save_pretrained(tmp_path / "hf")
    load = f"transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'hf')!r})"
    code = ("import transformers, linlm.hf;"
            "c = transformers.AutoConfig.for_model('linlm_mossnet', hidden_size=32, num_hidden_layers=1, vocab_size=64);"
            "print(type(c).__name__, transformers.AutoModelForCausalLM.from_config(c).__class__.__name__,"
            f"type({load}).__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["LinlmMossnetConfig", "LinlmMossnetForCausalLM", "LinlmTnlForCausalLM"]
    proc = subprocess.run([sys.executable, "-c", f"import transformers, linlm; {load}"], capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "linlm_tnl" in proc.stderr


def test_cli_generate_from_a_save_pretrained_dir(tmp_path, capsys):
    from linlm.cli import main
    from linlm.data.tokenizer import Tokenizer

    tok = Tokenizer.train(["the king and the queen ride north at dawn"] * 20, 280)
    model = tiny("cosformer2", vocab_size=288)
    model.save(tmp_path / "linlm")
    tok.save(tmp_path / "linlm")
    to_hf(model).save_pretrained(tmp_path / "hf")
    tok.save(tmp_path / "hf")
    outs = []
    for d in ("linlm", "hf"):
        assert main(["generate", "--model", str(tmp_path / d), "--prompt", "the king", "--max-new-tokens", "8",
                     "--temperature", "0"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0].startswith("the king")
