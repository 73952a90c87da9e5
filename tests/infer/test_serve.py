"""`linlm serve` through a real HTTP client against a real uvicorn server on the loopback address."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from linlm.cli import main  # noqa: E402
from linlm.infer.generate import generate, load_for_generation  # noqa: E402


def save_tiny(path, tokenizer, arch):
    import torch

    from linlm import create_model

    torch.manual_seed(0)
    create_model(arch, preset="tiny", vocab_size=320).eval().save(path)
    tokenizer.save(path)

PROMPTS = ["the king", "a land far", "ride north to", "their old friend", "queen of", "at dawn the", "meet", "far"]


class Running:
    def __init__(self, path, **kw):
        from linlm.infer.serve import Server, make_app

        self.model, self.tok = load_for_generation(path)
        self.server = Server(self.model, self.tok, path, name="tiny", **kw)
        self.uv = uvicorn.Server(uvicorn.Config(make_app(self.server), host="127.0.0.1", port=0, log_level="error"))
        self.thread = threading.Thread(target=self.uv.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.uv.started and time.monotonic() < deadline:
            time.sleep(0.02)
        port = self.uv.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"

    def close(self):
        self.uv.should_exit = True
        self.thread.join(timeout=20)
        self.server.batcher.close()


@pytest.fixture(scope="module")
def hgrn2(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("serve") / "hgrn2"
    save_tiny(path, tokenizer, arch="hgrn2")
    run = Running(path, max_tokens_limit=64)
    yield run
    run.close()


def _complete(url, prompt, **kw):
    r = httpx.post(f"{url}/completions", json={"prompt": prompt, "temperature": 0, "max_tokens": 8, **kw}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(url, prompt, **kw):
    pieces, finish = [], None
    with httpx.stream("POST", f"{url}/completions", timeout=60,
                      json={"prompt": prompt, "temperature": 0, "max_tokens": 8, "stream": True, **kw}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    for ln in lines[:-1]:
        choice = json.loads(ln[len("data: "):])["choices"][0]
        pieces.append(choice["text"])
        finish = choice["finish_reason"] or finish
    return "".join(pieces), finish


def test_completion_is_greedy_generation_streamed_or_not(hgrn2):
    out = _complete(hgrn2.url, "the king")
    want = generate(hgrn2.model, hgrn2.tok, "the king", 8, temperature=0)
    assert out["object"] == "text_completion" and out["choices"][0]["text"] == want
    assert out["usage"]["completion_tokens"] <= 8 and out["choices"][0]["finish_reason"] in ("stop", "length")
    assert _stream(hgrn2.url, "the king") == (want, out["choices"][0]["finish_reason"])
    assert httpx.get(f"{hgrn2.url}/models").json()["data"][0]["id"] == "tiny"


def test_concurrent_requests_share_the_batch_and_each_gets_its_own_answer(hgrn2):
    want = {p: generate(hgrn2.model, hgrn2.tok, p, 8, temperature=0) for p in PROMPTS}
    got = {}

    def ask(p):
        got[p] = _complete(hgrn2.url, p)["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == want


def test_stop_strings_and_sampling_settings(hgrn2):
    full = _complete(hgrn2.url, "the king", max_tokens=12)["choices"][0]["text"]
    assert len(full) > 3
    stop = full[2:4]
    out = _complete(hgrn2.url, "the king", max_tokens=12, stop=[stop])["choices"][0]
    assert out["text"] == full[:full.find(stop)] and out["finish_reason"] == "stop"
    assert _stream(hgrn2.url, "the king", max_tokens=12, stop=stop) == (out["text"], "stop")
    a = _complete(hgrn2.url, "the king", temperature=1.0, top_k=5, top_p=0.9, seed=3)["choices"][0]["text"]
    b = _complete(hgrn2.url, "the king", temperature=1.0, top_k=5, top_p=0.9, seed=3)["choices"][0]["text"]
    assert a == b  # seeded sampling repeats


def test_a_client_leaving_mid_stream_frees_its_row(hgrn2):
    with httpx.stream("POST", f"{hgrn2.url}/completions", timeout=60,
                      json={"prompt": "the king", "max_tokens": 60, "stream": True, "stop": ["\x00"]}) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 20
    while hgrn2.server.batcher.live and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not hgrn2.server.batcher.live
    assert _complete(hgrn2.url, "the king")["choices"][0]["text"]  # still serving


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b'["a list"]', None),
    (json.dumps({"prompt": 3}).encode(), "prompt"),
    (json.dumps({"prompt": "a", "max_tokens": "8"}).encode(), "max_tokens"),
    (json.dumps({"prompt": "a", "max_tokens": 65}).encode(), "max_tokens"),  # over the server's limit of 64
    (json.dumps({"prompt": "a", "temperature": -1}).encode(), "temperature"),
    (json.dumps({"prompt": "a", "stop": [1]}).encode(), "stop"),
])
def test_bad_requests_get_a_json_400_and_the_server_keeps_serving(hgrn2, body, param):
    r = httpx.post(f"{hgrn2.url}/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] and err["param"] == param
    assert _complete(hgrn2.url, "the king")["choices"][0]["text"]


def test_chat_needs_a_template_and_unknown_paths_are_json_404(hgrn2):
    r = httpx.post(f"{hgrn2.url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
    r = httpx.get(f"{hgrn2.url}/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_chat_with_a_template(tmp_path, tokenizer):
    path = tmp_path / "chat"
    save_tiny(path, tokenizer, arch="mamba")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    run = Running(path)
    try:
        r = httpx.post(f"{run.url}/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "the king"}], "temperature": 0, "max_tokens": 6})
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        assert msg["role"] == "assistant"
        assert msg["content"] == generate(run.model, run.tok, "user: the king\nassistant:", 6, temperature=0)
    finally:
        run.close()


def test_prompt_longer_than_the_context_is_a_400(model_dir):
    run = Running(model_dir)  # a LLaMA with max_seq_len 64
    try:
        r = httpx.post(f"{run.url}/completions", json={"prompt": "the king " * 80, "max_tokens": 4})
        assert r.status_code == 400 and "context" in r.json()["error"]["message"]
        assert _complete(run.url, "the king", max_tokens=4)["choices"][0]["text"] is not None
    finally:
        run.close()


def test_port_in_use_or_not_a_model_is_one_line(model_dir, tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", str(model_dir), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port}" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    assert main(["serve", str(tmp_path / "empty"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("linlm: error:") and len(err.strip().splitlines()) == 1
