"""Divergence check: a real vLLM (CPU build, tiny local model) and ``motor-sim vllm serve`` get the
same requests; their response *shapes* must agree (text never does: the model is random).

Needs ``scripts/real-engine-setup`` (``.real-engine/venv`` + ``.real-engine/tiny-llama``); skips
only when the venv is absent. Both engines run on 127.0.0.1 with the same served name and limits.
Start-up time and request latencies are written to ``.real-engine/last-run.json``.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".real-engine" / "venv"
MODEL_DIR = ROOT / ".real-engine" / "tiny-llama"
REAL_VLLM = ROOT / "scripts" / "real-vllm"
MOTOR_SIM = str(Path(sys.executable).with_name("motor-sim"))
NAME = "tiny"
LIMITS = ["--max-model-len", "256", "--max-num-seqs", "4", "--dtype", "float32"]
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")

def lane(timeout: float, *, slow: bool = True) -> list[pytest.MarkDecorator]:
    """The marks of a real-vLLM lane module: skipped without .real-engine/venv, its own timeout."""
    return [
        pytest.mark.realengine,
        *([pytest.mark.slow] if slow else []),
        pytest.mark.timeout(timeout),
        pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                           reason="no .real-engine/venv: run scripts/real-engine-setup"),
    ]


pytestmark = lane(900, slow=False)


# --- processes -----------------------------------------------------------------------------------
@dataclass
class Engine:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    startup_s: float = 0.0
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@dataclass
class Pair:
    real: Engine
    sim: Engine

    def both(self) -> tuple[Engine, Engine]:
        return self.real, self.sim



def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, TimeoutError):
        return None


def _spawn(name: str, argv: list[str], log_dir: Path, env: dict[str, str]) -> Engine:
    port = free_port()
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(port)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    return Engine(name, proc, port, log_path)


def _wait_healthy(e: Engine, t0: float, deadline_s: float) -> None:
    while time.monotonic() - t0 < deadline_s:
        if e.proc.poll() is not None:
            raise AssertionError(f"{e.name} exited with {e.proc.returncode}:\n{e.log()}")
        if _status(e.url + "/health") == 200:
            e.startup_s = time.monotonic() - t0
            return
        time.sleep(0.2)
    raise AssertionError(f"{e.name} not healthy within {deadline_s}s:\n{e.log()}")


def _stop(e: Engine) -> None:
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(e.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            e.proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the engine core / workers live in the same group
        os.killpg(e.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    assert (MODEL_DIR / "config.json").exists(), \
        "the venv exists but .real-engine/tiny-llama does not: run scripts/real-engine-setup"
    with tempfile.TemporaryDirectory(prefix="realengine-") as tmp:
        env = dict(os.environ)
        model = str(MODEL_DIR)
        t0 = time.monotonic()
        real = _spawn("vllm", [str(REAL_VLLM), "serve", model, "--served-model-name", NAME, *LIMITS],
                      Path(tmp), env)
        try:
            _wait_healthy(real, t0, 600)
            t1 = time.monotonic()
            sim = _spawn("motor-sim", [MOTOR_SIM, "vllm", "serve", model, "--served-model-name",
                                       NAME, *LIMITS], Path(tmp), env)
            try:
                _wait_healthy(sim, t1, 30)
                p = Pair(real, sim)
                yield p
                _record(p)
            finally:
                _stop(sim)
        finally:
            _stop(real)


def _record(p: Pair) -> None:
    out: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpu_count": os.cpu_count(),
                           "loadavg": os.getloadavg()}
    for e in p.both():
        out[e.name] = {"startup_s": round(e.startup_s, 2), "latency_ms": {
            k: {"median": round(statistics.median(v), 1), "min": round(min(v), 1), "n": len(v)}
            for k, v in e.latencies_ms.items()}}
    (ROOT / ".real-engine" / "last-run.json").write_text(json.dumps(out, indent=1) + "\n")
    print("\nreal-engine measurements:", json.dumps(out, indent=1))


# --- helpers -------------------------------------------------------------------------------------
@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any
    raw: str
    ms: float


async def call(e: Engine, method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None, tag: str | None = None) -> Reply:
    t = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s, \
            s.request(method, e.url + path, json=body, headers=headers or {}) as r:
        raw = (await r.read()).decode(errors="replace")
        ms = (time.monotonic() - t) * 1000
        parsed: Any = None
        if "json" in r.headers.get("Content-Type", ""):
            parsed = json.loads(raw)
        if tag is not None:
            e.latencies_ms.setdefault(tag, []).append(ms)
        return Reply(r.status, {k.lower(): v for k, v in r.headers.items()}, parsed, raw, ms)


async def both(p: Pair, method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None, tag: str | None = None) -> tuple[Reply, Reply]:
    return (await call(p.real, method, path, body, headers, tag),
            await call(p.sim, method, path, body, headers, tag))


def shape(v: Any) -> Any:
    """The structure of a JSON value: keys and value kinds, never the values themselves."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in sorted(v.items())}
    if isinstance(v, list):
        return [shape(v[0])] if v else []
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    return type(v).__name__


def sse_events(raw: str) -> list[Any]:
    events: list[Any] = []
    for block in raw.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), f"not an SSE data line: {block!r}"
        data = block[len("data: "):]
        events.append("[DONE]" if data == "[DONE]" else json.loads(data))
    return events


def chunk_kinds(events: list[Any]) -> dict[str, Any]:
    """Group stream chunks by role (role / content / finish / usage) -> merged shape per group."""
    out: dict[str, Any] = {}
    for ev in events[:-1]:
        if not ev["choices"]:
            kind = "usage"
        elif "role" in ev["choices"][0].get("delta", {}):
            kind = "role"
        elif ev["choices"][0].get("finish_reason") is not None:
            kind = "finish"
        else:
            kind = "content"
        sh = shape(ev)
        assert out.setdefault(kind, sh) == sh, f"{kind} chunks differ in shape among themselves"
    return out


# Real vLLM decides finish_reason "stop" when the random model emits EOS; ignore_eos pins "length".
CMPL = {"model": NAME, "prompt": "Hello world, how are", "max_tokens": 5, "ignore_eos": True}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5,
        "ignore_eos": True}


# --- tests ---------------------------------------------------------------------------------------
async def test_health_ping_version_and_models(pair: Pair) -> None:
    for path in ("/health", "/ping"):
        real, sim = await both(pair, "GET", path, tag="health")
        assert (real.status, real.raw) == (sim.status, sim.raw) == (200, "")
    real, sim = await both(pair, "GET", "/version")
    assert real.status == sim.status == 200
    assert real.body == sim.body, "the simulator claims another vLLM version"
    real, sim = await both(pair, "GET", "/v1/models")
    assert shape(real.body) == shape(sim.body)
    r, s = real.body["data"][0], sim.body["data"][0]
    for key in ("id", "object", "owned_by", "root", "parent", "max_model_len"):
        assert r[key] == s[key], key
    assert len(r["permission"][0]["id"]) == len(s["permission"][0]["id"])


async def test_completion_non_stream_shapes(pair: Pair) -> None:
    real, sim = await both(pair, "POST", "/v1/completions", CMPL, tag="completion_5tok")
    assert real.status == sim.status == 200
    assert shape(real.body) == shape(sim.body)
    for b in (real.body, sim.body):
        ch = b["choices"][0]
        assert b["object"] == "text_completion" and b["model"] == NAME
        assert ch["finish_reason"] == "length" and ch["stop_reason"] is None
        u = b["usage"]
        assert u["completion_tokens"] == 5 and u["total_tokens"] == u["prompt_tokens"] + 5
        assert b["kv_transfer_params"] is None
        assert b["system_fingerprint"].startswith("vllm-0.32.0-")
        assert b["id"].startswith("cmpl-") and len(b["id"]) == len("cmpl-") + 16


async def test_chat_non_stream_shapes(pair: Pair) -> None:
    real, sim = await both(pair, "POST", "/v1/chat/completions", CHAT, tag="chat_5tok")
    assert real.status == sim.status == 200
    assert shape(real.body) == shape(sim.body)
    for b in (real.body, sim.body):
        assert b["object"] == "chat.completion" and b["choices"][0]["finish_reason"] == "length"
        assert b["choices"][0]["message"]["role"] == "assistant"
        assert b["usage"]["completion_tokens"] == 5
    # max_completion_tokens is honoured like max_tokens
    body = dict(CHAT, max_completion_tokens=3)
    del body["max_tokens"]
    real, sim = await both(pair, "POST", "/v1/chat/completions", body)
    assert real.body["usage"]["completion_tokens"] == sim.body["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("path,body", [("/v1/completions", CMPL), ("/v1/chat/completions", CHAT)],
                         ids=["completions", "chat"])
@pytest.mark.parametrize("usage", [True, False], ids=["usage", "no-usage"])
async def test_sse_stream_shapes(pair: Pair, path: str, body: dict[str, Any], usage: bool) -> None:
    req = dict(body, stream=True)
    if usage:
        req["stream_options"] = {"include_usage": True}
    real, sim = await both(pair, "POST", path, req, tag="stream_5tok")
    assert real.status == sim.status == 200
    assert real.headers["content-type"] == sim.headers["content-type"] == \
        "text/event-stream; charset=utf-8"
    ev_real, ev_sim = sse_events(real.raw), sse_events(sim.raw)
    for evs in (ev_real, ev_sim):
        assert evs[-1] == "[DONE]" and "[DONE]" not in evs[:-1]
        finishes = [c["finish_reason"] for e in evs[:-1] for c in e["choices"] if c["finish_reason"]]
        assert finishes == ["length"]
        if usage:
            last = evs[-2]
            assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5
        else:
            assert all("usage" not in e for e in evs[:-1])
    assert chunk_kinds(ev_real) == chunk_kinds(ev_sim)
    assert ("system_fingerprint" in ev_real[-2]) == ("system_fingerprint" in ev_sim[-2])


async def test_continuous_usage_stats_shape(pair: Pair) -> None:
    req = dict(CMPL, stream=True, max_tokens=3,
               stream_options={"include_usage": True, "continuous_usage_stats": True})
    real, sim = await both(pair, "POST", "/v1/completions", req)
    assert chunk_kinds(sse_events(real.raw)) == chunk_kinds(sse_events(sim.raw))


async def test_openai_sdk_reads_both(pair: Pair) -> None:
    for e in pair.both():
        c = openai.AsyncOpenAI(base_url=e.url + "/v1", api_key="x", max_retries=0, timeout=60)
        models = await c.models.list()
        assert [m.id for m in models.data] == [NAME]
        cmpl = await c.completions.create(model=NAME, prompt="Hello", max_tokens=3,
                                          extra_body={"ignore_eos": True})
        assert cmpl.usage is not None and cmpl.usage.completion_tokens == 3
        chat = await c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3, extra_body={"ignore_eos": True})
        assert chat.choices[0].finish_reason == "length"
        stream = await c.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        chunks = [ch async for ch in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
        with pytest.raises(openai.NotFoundError):
            await c.completions.create(model="nope", prompt="x", max_tokens=1)
        with pytest.raises(openai.BadRequestError):
            await c.completions.create(model=NAME, prompt="x", max_tokens=0)
        await c.close()


async def test_unknown_model_is_the_same_404(pair: Pair) -> None:
    for path, body in (("/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 2}),
                       ("/v1/chat/completions", {"model": "nope", "messages": [
                           {"role": "user", "content": "x"}]})):
        real, sim = await both(pair, "POST", path, body)
        assert real.status == sim.status == 404
        assert real.body == sim.body == {"error": {
            "message": f"The model `nope` does not exist. Valid aliases: {NAME}.",
            "type": "NotFoundError", "param": "model", "code": 404}}


BAD_PARAMS = {
    "temperature<0": {"temperature": -1},
    "top_p>1": {"top_p": 2},
    "max_tokens=0": {"max_tokens": 0},
    "max_tokens>max_model_len": {"max_tokens": 100000},
    "n=0": {"n": 0},
    "logprobs>max_logprobs": {"logprobs": 1000},  # the poison request of issue 12
    "stream_options without stream": {"stream_options": {"include_usage": True}},
}


@pytest.mark.parametrize("extra", list(BAD_PARAMS.values()), ids=list(BAD_PARAMS))
async def test_bad_parameters_are_the_same_400(pair: Pair, extra: dict[str, Any]) -> None:
    real, sim = await both(pair, "POST", "/v1/completions", dict(CMPL, **extra))
    assert real.status == sim.status == 400
    if "stream_options" in extra:  # the simulator words it without the (parameter=...) suffix
        assert shape(real.body) == shape(sim.body)
        assert real.body["error"]["param"] == sim.body["error"]["param"]
    else:
        assert real.body == sim.body


async def test_validation_errors_and_overlong_prompts(pair: Pair) -> None:
    real, sim = await both(pair, "POST", "/v1/completions", dict(CMPL, max_tokens="a"))
    assert real.status == sim.status == 400
    for b in (real.body, sim.body):
        assert b["error"]["type"] == "Bad Request" and b["error"]["param"] == "body.max_tokens"
        assert b["error"]["message"].startswith("1 validation error:")
    real, sim = await both(pair, "POST", "/v1/chat/completions", {"model": NAME, "messages": []})
    assert real.status == sim.status == 400 and real.body == sim.body
    # a prompt longer than the context: refused, naming input_tokens
    real, sim = await both(pair, "POST", "/v1/completions",
                           dict(CMPL, prompt="Hello world " * 200, max_tokens=2))
    assert real.status == sim.status == 400
    assert real.body["error"]["param"] == sim.body["error"]["param"] == "input_tokens"
    assert "maximum context length is 256" in sim.body["error"]["message"]
    # prompt + max_tokens over the context: vLLM 0.32 clamps instead of refusing
    real, sim = await both(pair, "POST", "/v1/completions",
                           dict(CMPL, prompt="Hello world " * 40, max_tokens=250))
    assert real.status == sim.status == 200
    for b in (real.body, sim.body):
        assert b["usage"]["total_tokens"] == 256 and b["choices"][0]["finish_reason"] == "length"
    # no max_tokens on completions: 16, as in the OpenAI API
    body = {k: v for k, v in CMPL.items() if k != "max_tokens"}
    real, sim = await both(pair, "POST", "/v1/completions", body)
    assert real.body["usage"]["completion_tokens"] == sim.body["usage"]["completion_tokens"] == 16


async def test_unknown_route_is_fastapi_404(pair: Pair) -> None:
    real, sim = await both(pair, "GET", "/nope")
    assert real.status == sim.status == 404 and real.body == sim.body == {"detail": "Not Found"}


async def test_request_id_names_the_response_and_is_not_echoed_by_default(pair: Pair) -> None:
    real, sim = await both(pair, "POST", "/v1/completions", CMPL, {"X-Request-Id": "motor-rid-1"})
    assert real.body["id"] == sim.body["id"] == "cmpl-motor-rid-1"
    assert "x-request-id" not in real.headers and "x-request-id" not in sim.headers
    real, sim = await both(pair, "POST", "/v1/chat/completions", CHAT, {"X-Request-Id": "motor-rid-2"})
    assert real.body["id"] == sim.body["id"] == "chatcmpl-motor-rid-2"


async def test_metrics_gauges_used_by_motor(pair: Pair) -> None:
    for e in pair.both():
        r = await call(e, "GET", "/metrics")
        assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
        for g in GAUGES:
            assert f"# TYPE {g} gauge" in r.raw, f"{e.name}: {g} missing"
            lines = [ln for ln in r.raw.splitlines() if ln.startswith(g + "{")]
            assert lines, f"{e.name}: no sample of {g}"
            assert f'model_name="{NAME}"' in lines[0] and 'engine="0"' in lines[0]
            float(lines[0].rsplit(" ", 1)[1])


@pytest.mark.parametrize("path,body", [("/v1/completions", CMPL), ("/v1/chat/completions", CHAT)],
                         ids=["completions", "chat"])
async def test_kv_transfer_params_without_a_connector_are_ignored(
    pair: Pair, path: str, body: dict[str, Any],
) -> None:
    prefill = dict(body, max_tokens=1, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False})
    decode = dict(body, max_tokens=3, kv_transfer_params={
        "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "x",
        "remote_block_ids": [1], "remote_host": "127.0.0.1", "remote_port": 1,
        "remote_request_id": "x"})
    for req, n in ((prefill, 1), (decode, 3)):
        real, sim = await both(pair, "POST", path, req)
        assert real.status == sim.status == 200
        for b in (real.body, sim.body):
            assert b["kv_transfer_params"] is None and b["usage"]["completion_tokens"] == n


async def test_latency_sample(pair: Pair) -> None:
    """Not a pass/fail gate: records medians into .real-engine/last-run.json."""
    for _ in range(5):
        await both(pair, "POST", "/v1/completions", dict(CMPL, max_tokens=16), tag="completion_16tok")
        await both(pair, "POST", "/v1/completions", dict(CMPL, max_tokens=1), tag="completion_1tok")
    for e in pair.both():
        for _ in range(3):
            t = time.monotonic()
            async with aiohttp.ClientSession() as s, s.post(
                e.url + "/v1/completions", json=dict(CMPL, max_tokens=16, stream=True)) as r:
                async for _line in r.content:
                    e.latencies_ms.setdefault("ttft_stream", []).append((time.monotonic() - t) * 1000)
                    break
                await r.read()
