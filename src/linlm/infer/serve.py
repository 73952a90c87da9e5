"""``linlm serve MODEL``: an OpenAI-compatible HTTP server on FastAPI and uvicorn (the ``serve`` extra).

Endpoints: ``GET /v1/models``, ``POST /v1/completions`` (a string prompt) and ``POST /v1/chat/completions`` (when
the tokenizer directory's tokenizer_config.json has a ``chat_template``, rendered with jinja2 as transformers does).
Settings: ``max_tokens`` (default 16), ``temperature`` (default 1), ``top_p``, ``top_k`` (0: all; not in OpenAI's
API), ``seed``, ``stop`` (a string or a list of up to 4), ``stream`` (server-sent events, ``data: {...}`` chunks then
``data: [DONE]``). Requests share one decoding batch (linlm.infer.batcher).

A bad request gets a JSON error ``{"error": {"message", "type", "param"}}`` with a 4xx status: 400 for JSON that
does not parse, a field of the wrong type or out of range, a prompt longer than the model's context, or more tokens
than the server allows (``max_tokens`` over ``--max-tokens``, or past LLaMA's ``max_seq_len``); 404 for an unknown
path. A client that goes away mid-stream frees its row at the next step. The server keeps serving through all of it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from linlm.errors import ConfigError
from linlm.infer.batcher import Batcher, Request


class BadRequest(Exception):
    def __init__(self, message: str, param: Optional[str] = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def _error(status: int, message: str, param: Optional[str] = None):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param}},
                        status_code=status)


def chat_template(model_dir: Path) -> Optional[str]:
    try:
        cfg = json.loads((Path(model_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = cfg.get("chat_template") if isinstance(cfg, dict) else None
    return template if isinstance(template, str) else None


def _number(body: dict, name: str, default, kind, lo=None, hi=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise BadRequest(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi) or value != value:
        raise BadRequest(f"{name} must be in [{lo}, {hi}], got {value!r}", name)
    return kind(value)


class Server:
    def __init__(self, model, tokenizer, model_dir: Path, *, name: str, max_batch: int = 32,
                 max_tokens_limit: int = 4096):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.template = chat_template(model_dir)
        self.max_tokens_limit = max_tokens_limit
        self.batcher = Batcher(model, tokenizer, max_batch=max_batch)

    def settings(self, body: dict, prompt_ids: list[int]) -> dict:
        cfg = self.model.config
        max_tokens = _number(body, "max_tokens", 16, int, 0, self.max_tokens_limit)
        from linlm.models.registry import get_arch

        if get_arch(cfg.arch).position_limit and len(prompt_ids) + max_tokens > cfg.max_seq_len:
            what = "prompt" if len(prompt_ids) >= cfg.max_seq_len else "prompt plus max_tokens"
            raise BadRequest(f"the {what} ({len(prompt_ids)} + {max_tokens} tokens) exceeds this model's context "
                             f"of {cfg.max_seq_len} tokens", "max_tokens" if what != "prompt" else "prompt")
        stop = body.get("stop") or ()
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
            raise BadRequest("stop must be a string or a list of at most 4 strings", "stop")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise BadRequest(f"seed must be an integer, got {seed!r}", "seed")
        return dict(max_tokens=max_tokens, temperature=_number(body, "temperature", 1.0, float, 0, 2),
                    top_p=_number(body, "top_p", 1.0, float, 1e-9, 1), top_k=_number(body, "top_k", 0, int, 0),
                    seed=seed, stop=tuple(s for s in stop if s))

    def prompt_ids(self, body: dict, chat: bool) -> list[int]:
        if chat:
            if self.template is None:
                raise BadRequest("this model's tokenizer has no chat template; use /v1/completions", "messages")
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in messages):
                raise BadRequest("messages must be a non-empty list of {role, content} strings", "messages")
            import jinja2

            text = jinja2.Environment().from_string(self.template).render(
                messages=messages, add_generation_prompt=True, eos_token=self.tokenizer.eos_token,
                bos_token=getattr(self.tokenizer, "bos_token", None) or "")
            return self.tokenizer.encode(text)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string", "prompt")
        ids = self.tokenizer.encode_input(prompt)
        return ids or [self.tokenizer.eos_id]

    async def complete(self, request, chat: bool):
        from fastapi.responses import JSONResponse, StreamingResponse

        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            return _error(400, f"the request body is not valid JSON ({e})")
        try:
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            ids = self.prompt_ids(body, chat)
            settings = self.settings(body, ids)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise BadRequest("stream must be true or false", "stream")
        except BadRequest as e:
            return _error(e.status, e.message, e.param)
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        job = Request(ids, emit=lambda text, finish: loop.call_soon_threadsafe(pieces.put_nowait, (text, finish)),
                      **settings)
        self.batcher.submit(job)
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def choice(text, finish, delta=False):
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            key = "delta" if delta else "message"
            return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}

        def usage(n):
            return {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}

        if not stream:
            texts, finish = [], None
            try:
                while finish is None:
                    text, finish = await pieces.get()
                    texts.append(text)
            except asyncio.CancelledError:
                job.cancelled.set()
                raise
            if finish == "error":
                return _error(500, "".join(texts))
            return JSONResponse({"id": rid, "object": kind, "created": created, "model": self.name,
                                 "choices": [choice("".join(texts), finish)], "usage": usage(len(job.ids))})

        async def events():
            finish = None
            try:
                while finish is None:
                    text, finish = await pieces.get()
                    if text or finish:
                        chunk = {"id": rid, "object": kind + (".chunk" if chat else ""), "created": created,
                                 "model": self.name, "choices": [choice(text, finish, delta=True)]}
                        yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                job.cancelled.set()  # a client gone mid-stream frees its row at the next step

        return StreamingResponse(events(), media_type="text/event-stream")


def make_app(server: Server):
    from fastapi import FastAPI, Request as HTTPRequest
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    app = FastAPI(title="linlm", docs_url=None, redoc_url=None)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc):
        return _error(400, str(exc))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": server.name, "object": "model", "owned_by": "linlm"}]}

    async def completions(request):
        return await server.complete(request, chat=False)

    async def chat(request):
        return await server.complete(request, chat=True)

    # The annotation as an object (this module's annotations are strings, which FastAPI would look up in its globals).
    for path, endpoint in (("/v1/completions", completions), ("/v1/chat/completions", chat)):
        endpoint.__annotations__["request"] = HTTPRequest
        app.post(path)(endpoint)

    return app


def check_port(host: str, port: int) -> None:
    """Refuse a port that is taken (before the model loads) with a one-line ConfigError."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror or e}); choose a free "
                              f"port or stop what uses it") from None


def serve(model_path, *, host: str = "127.0.0.1", port: int = 8000, tokenizer=None, max_batch: int = 32,
          max_tokens_limit: int = 4096) -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise ConfigError("linlm serve needs FastAPI and uvicorn: pip install 'linlm[serve]'") from None
    from linlm.data.tokenizer import tokenizer_for_model
    from linlm.infer.generate import load_model

    check_port(host, port)
    model, model_dir = load_model(model_path)
    tok = tokenizer_for_model(model_dir, tokenizer, model.config.vocab_size)
    server = Server(model, tok, model_dir, name=Path(model_path).name, max_batch=max_batch,
                    max_tokens_limit=max_tokens_limit)
    print(f"linlm serve: {model_path} on http://{host}:{port}/v1 (batch up to {max_batch})", flush=True)
    uvicorn.run(make_app(server), host=host, port=port, log_level="warning")
