"""Independent protocol clients: vllm-router and sglang-router, unmodified from the package registry
(``scripts/routers-setup``), in PD mode in front of a ``motor-sim`` prefill/decode pair, must give
the same answers as a ``motor-sim`` union engine — every check of completions, chat, SSE, models
and errors, sampled text at temperature 0.8 included.

This is the evidence that the simulator's PD protocols (vLLM's NIXL ``kv_transfer_params``,
SGLang's bootstrap rooms) are the engines' own: two routers written by the engines' projects drive
them without knowing about Motor. (SGLang itself cannot run on this CPU, see README.)

What the routers do differently, and the checks therefore compare:

- ids, ``created`` and (vllm-router) the id's embedded P/D addresses differ: never compared;
- floats: the routers re-serialise JSON with a float parser that may move a double by one unit in
  the last place; real engines' logprobs are float32 values, so logprobs are compared as float32;
- sglang-router answers ``/v1/models`` itself (``owned_by: local``) and re-wraps engine errors as
  ``{"error": {"type": "Bad Request", "code": "decode_bad_request", "message"}}``: models are
  compared by id, errors by status and message (sglang-router refuses ``top_p > 1`` itself, same
  400, its own wording "top_p: Validation error: ...": there only the status is compared);
- ``max_tokens: -1``: both routers answer 422 ``text/plain`` "Failed to deserialize the JSON body
  ... expected u32" before any engine sees the request (the engines answer 400): router behaviour,
  pinned by its own test below.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.helpers import free_port
from tests.procs import Proc, running, start_simulator

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".bench" / "routers-venv"
MODEL = "conf"
TIMEOUT = aiohttp.ClientTimeout(total=30)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not (VENV / ".motor-routers").exists(),
                       reason="no .bench/routers-venv: run scripts/routers-setup (scripts/test does)"),
]  # fmt: skip


@dataclass
class Stack:
    flavour: str
    router: Proc
    union: Proc


def _serves(port: int) -> Callable[[Proc], bool]:
    def ready(p: Proc) -> bool:
        import urllib.request

        p.port = port
        body = json.dumps({"model": MODEL, "prompt": "ready?", "max_tokens": 1}).encode()
        req = urllib.request.Request(p.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    return ready


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["vllm", "sglang"])
async def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    flavour: str = request.param
    logs = tmp_path_factory.mktemp(f"conformance-{flavour}")
    async with AsyncExitStack() as st:
        p = await st.enter_async_context(start_simulator(flavour, "prefill", logs, model=MODEL))
        d = await st.enter_async_context(start_simulator(flavour, "decode", logs, model=MODEL))
        u = await st.enter_async_context(start_simulator(flavour, "union", logs, model=MODEL))
        port = free_port()
        if flavour == "vllm":
            argv = [str(VENV / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                    "--vllm-pd-disaggregation", "--policy", "round_robin", "--prefill", p.url, "--decode", d.url,
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        else:
            argv = [str(VENV / "bin" / "python"), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                    "--port", str(port), "--pd-disaggregation", "--policy", "round_robin",
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                    "--prefill", p.url, str(p.extra["bootstrap_port"]), "--decode", d.url]
        router = await st.enter_async_context(
            running(f"{flavour}-router", argv, logs, ready=_serves(port), deadline=60))
        yield Stack(flavour, router, u)


async def _call(url: str, method: str, path: str, body: Any) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.request(method, url + path, json=body) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


async def both(stack: Stack, method: str, path: str, body: Any = None) -> tuple[tuple[int, str, bytes], ...]:
    return (await _call(stack.router.url, method, path, body), await _call(stack.union.url, method, path, body))


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _logprobs(lp: Any) -> Any:
    """Logprob values as float32 (the routers' float parsing may move a double by 1 ulp)."""
    if isinstance(lp, float):
        return f32(lp)
    if isinstance(lp, dict):
        return {k: _logprobs(v) for k, v in lp.items() if k != "bytes"}
    if isinstance(lp, list):
        return [_logprobs(v) for v in lp]
    return lp


def answer(raw: bytes) -> dict[str, Any]:
    """What a client reads from a JSON answer: per choice text, finish, logprobs; usage."""
    obj = json.loads(raw)
    out = []
    for ch in obj["choices"]:
        text = ch["text"] if "text" in ch else ch["message"]["content"]
        out.append({"index": ch["index"], "text": text, "finish_reason": ch["finish_reason"],
                    "logprobs": _logprobs(ch.get("logprobs"))})
    usage = {k: obj["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {"model": obj["model"], "object": obj["object"], "choices": out, "usage": usage}


def stream(ctype: str, raw: bytes) -> dict[str, Any]:
    """What a client reads from an SSE answer: text per choice, finish reasons, the role chunk,
    the usage chunk, [DONE] last."""
    assert ctype.startswith("text/event-stream"), ctype
    events = [e for e in raw.decode().split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]", events[-3:]
    texts: dict[int, str] = {}
    finishes: list[tuple[int, str]] = []
    roles: list[str] = []
    usage = None
    for e in events[:-1]:
        assert e.startswith("data: "), e
        obj = json.loads(e[6:])
        if obj.get("usage"):
            usage = {k: obj["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        for ch in obj["choices"]:
            delta = ch.get("delta")
            part = ch.get("text") if delta is None else delta.get("content")
            if delta is not None and delta.get("role"):
                roles.append(delta["role"])
            texts[ch["index"]] = texts.get(ch["index"], "") + (part or "")
            if ch.get("finish_reason"):
                finishes.append((ch["index"], ch["finish_reason"]))
    return {"texts": texts, "finishes": finishes, "roles": roles, "usage": usage}


def error(flavour: str, status: int, raw: bytes) -> tuple[int, str]:
    """(status, message) of an error answer, whichever envelope carries it."""
    obj = json.loads(raw)
    err = obj.get("error", obj)
    return status, str(err["message"] if isinstance(err, dict) else err)


def router_validated(message: str, param: str) -> bool:
    """sglang-router validates some sampling parameters itself (its own wording, same status)."""
    return message.startswith(f"{param}: Validation error: ")


CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
PROMPT = "Prefill and decode run on different engines"
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}]

# (check name, path, body, kind): kind json | sse | error
CHECKS: list[tuple[str, str, dict[str, Any], str]] = [
    ("completion greedy", CMPL, {"prompt": PROMPT, "max_tokens": 9, "temperature": 0}, "json"),
    ("completion sampled t=0.8", CMPL, {"prompt": PROMPT, "max_tokens": 9, "temperature": 0.8, "seed": 11}, "json"),
    ("completion sampled t=0.8 top_p=0.9 n=2", CMPL,
     {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.8, "top_p": 0.9, "n": 2, "seed": 5}, "json"),
    ("completion logprobs", CMPL, {"prompt": PROMPT, "max_tokens": 5, "temperature": 0.8, "seed": 2, "logprobs": 3},
     "json"),
    ("completion stop string", CMPL, {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": [" the"]}, "json"),
    ("chat greedy", CHAT, {"messages": MSGS, "max_tokens": 8, "temperature": 0}, "json"),
    ("chat sampled t=0.8", CHAT, {"messages": MSGS, "max_tokens": 8, "temperature": 0.8, "seed": 4}, "json"),
    ("chat logprobs", CHAT, {"messages": MSGS, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}, "json"),
    ("completion SSE", CMPL, {"prompt": PROMPT, "max_tokens": 7, "stream": True}, "sse"),
    ("completion SSE sampled t=0.8 + usage", CMPL,
     {"prompt": PROMPT, "max_tokens": 7, "temperature": 0.8, "seed": 9, "stream": True,
      "stream_options": {"include_usage": True}}, "sse"),
    ("chat SSE", CHAT, {"messages": MSGS, "max_tokens": 6, "stream": True}, "sse"),
    ("chat SSE sampled t=0.8 + usage", CHAT,
     {"messages": MSGS, "max_tokens": 6, "temperature": 0.8, "seed": 8, "stream": True,
      "stream_options": {"include_usage": True}}, "sse"),
    ("error: temperature < 0", CMPL, {"prompt": PROMPT, "max_tokens": 3, "temperature": -1}, "error"),
    ("error: max_tokens 0", CMPL, {"prompt": PROMPT, "max_tokens": 0}, "error"),
    ("error: top_p > 1", CHAT, {"messages": MSGS, "max_tokens": 3, "top_p": 1.5}, "error"),
    ("error: unknown model", CMPL, {"model": "no-such-model", "prompt": PROMPT, "max_tokens": 3}, "error"),
]


@pytest.mark.parametrize("name,path,body,kind", CHECKS, ids=[c[0] for c in CHECKS])
async def test_router_in_pd_mode_agrees_with_the_union_simulator(
    stack: Stack, name: str, path: str, body: dict[str, Any], kind: str
) -> None:
    req = {"model": MODEL, **body}
    (rs, rt, rb), (us, ut, ub) = await both(stack, "POST", path, req)
    if kind == "error":
        # vLLM answers an unknown model with 404; SGLang serves whatever model is named
        assert rs >= 400 or stack.flavour == "sglang", (rs, rb)
        if us >= 400:
            (r_status, r_msg), (u_status, u_msg) = error(stack.flavour, rs, rb), error(stack.flavour, us, ub)
            assert r_status == u_status, (rb, ub)
            param = name.split(": ", 1)[1].split(" ", 1)[0]  # "error: top_p > 1" -> top_p
            if not (stack.flavour == "sglang" and router_validated(r_msg, param)):
                assert r_msg == u_msg, (rb, ub)
        else:
            assert rs == us == 200 and answer(rb)["choices"] == answer(ub)["choices"]
        return
    assert rs == us == 200, (rb[:500], ub[:500])
    if kind == "json":
        assert answer(rb) == answer(ub)
    else:
        got, want = stream(rt, rb), stream(ut, ub)
        assert got == want
        assert want["texts"][0] and want["finishes"]
        if path == CHAT:
            assert want["roles"][:1] == ["assistant"]


async def test_router_and_union_list_the_same_models(stack: Stack) -> None:
    (rs, _, rb), (us, _, ub) = await both(stack, "GET", "/v1/models")
    assert rs == us == 200
    assert [m["id"] for m in json.loads(rb)["data"]] == [m["id"] for m in json.loads(ub)["data"]] == [MODEL]


async def test_negative_max_tokens_is_refused_by_the_router_itself_with_422(stack: Stack) -> None:
    """Router behaviour, not an engine's: the routers' typed request (u32) refuses -1 before any
    engine sees it; the engine (and Motor, which relays the engine's answer) says 400."""
    (rs, rt, rb), (us, _, ub) = await both(stack, "POST", CMPL, {"model": MODEL, "prompt": PROMPT, "max_tokens": -1})
    assert rs == 422 and rt.startswith("text/plain"), (rs, rt, rb)
    assert b"expected u32" in rb
    assert us == 400 and "max_tokens must be at least 1" in error(stack.flavour, us, ub)[1]
