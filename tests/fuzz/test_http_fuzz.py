"""Property-based fuzzing of the OpenAI HTTP front (hypothesis): bodies, headers, methods, paths,
content types, encodings and sizes against a real ``motor-gateway`` in front of a real
``motor-coordinator`` and real simulated vLLM engines (prefill + decode), over raw sockets so that
any byte can be sent.

Invariants, checked on every example:

* no 5xx from bad input and no crash (every process still running);
* every error (status >= 400) is one OpenAI error object ``{"error": {message, type, param, code}}``;
* a rejected request changes no state: a 4xx leaves the decode engine's served-request and
  prompt-token counters unchanged, and one refused by the front (or the coordinator) leaves every
  engine's unchanged; admission control returns to zero in flight; the registry is the same after
  the run as before.

The co-located front (``motor-coordinator --http-port``) serves the same aiohttp application
(``motor_common.openai_front.app.Gateway``), so it is not fuzzed separately. Bounded: a fixed number of
examples per property (``MOTOR_FUZZ_EXAMPLES`` scales it), deterministic (``derandomize``), the
whole module well under 60 s.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import zlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import wait_for
from tests.procs import Proc, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

MODEL = "tiny"
KEY = "fuzz-management-key"
LIMIT = 64 * 1024  # the gateway's limits.max_body_bytes here (small keeps oversized examples cheap)
SCALE = float(os.environ.get("MOTOR_FUZZ_EXAMPLES", "1"))
# error types produced by Motor itself (front or coordinator), never by an engine
MOTOR_ERROR_TYPES = {"invalid_request_error", "not_found_error", "authentication_error", "rate_limit_error",
                     "permission_error", "conflict_error"}


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


@dataclass
class Fleet:
    gateway: Proc
    procs: list[Proc]
    prefill: Proc
    decode: Proc
    registry: str


async def _cli(*args: str, env: dict[str, str]) -> str:
    import asyncio

    from tests.conftest import tool

    proc = await asyncio.create_subprocess_exec(tool("motor"), *args, env={**os.environ, **env},
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out.decode()
    return out.decode()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    logs = tmp_path_factory.mktemp("http-fuzz")
    sim_args = ["--sim-zero-latency", "--max-model-len", "2048"]
    async with AsyncExitStack() as es:
        prefill = await es.enter_async_context(start_simulator("vllm", "prefill", logs, model=MODEL,
                                                               extra_args=sim_args, name="p"))
        decode = await es.enter_async_context(start_simulator("vllm", "decode", logs, model=MODEL,
                                                              extra_args=sim_args, name="d"))
        coordinator = await es.enter_async_context(start_coordinator(logs, management_key=KEY))
        gateway = await es.enter_async_context(start_gateway(
            logs, [coordinator.address],
            config={"limits": {"max_body_bytes": LIMIT, "body_timeout_sec": 5.0, "header_timeout_sec": 5.0},
                    "admission": {"max_in_flight_per_model": 4}}))
        (logs / "key").write_text(KEY)
        env = {"MOTOR_COORDINATOR": coordinator.address, "MOTOR_MANAGEMENT_KEY_FILE": str(logs / "key")}
        for role, sim in (("prefill", prefill), ("decode", decode)):
            await _cli("register", "add", "--role", role, "--model", MODEL, "--engine", "vllm",
                       "--endpoint", f"127.0.0.1:{sim.port},kv={sim.extra['side_channel_port']}", env=env)
        await wait_for(lambda: exchange(gateway.port, request("GET", "/health"))[0] == 200, timeout=20,
                       what="gateway ready")
        registry = await _cli("register", "list", "--json", env=env)
        yield Fleet(gateway, [prefill, decode, coordinator, gateway], prefill, decode, registry)
        assert await _cli("register", "list", "--json", env=env) == registry  # nothing changed the registry


# --- raw HTTP ------------------------------------------------------------------------------------


def request(method: str, path: str, body: bytes = b"", headers: dict[str, bytes] | None = None,
            *, chunked: bool = False) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += [k.encode() + b": " + v for k, v in (headers or {}).items()]
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
        payload = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 4096]), body[i:i + 4096])
                           for i in range(0, len(body), 4096)) + b"0\r\n\r\n"
    else:
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(b"Content-Length: " + str(len(body)).encode())
        payload = body
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


def exchange(port: int, data: bytes, timeout: float = 20.0) -> tuple[int, dict[str, str], bytes]:
    """Send *data*, read the answer until the server closes; (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early (e.g. 413) and closed while we were sending
        chunks = []
        while True:
            try:
                piece = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not piece:
                break
            chunks.append(piece)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.decode("latin-1").strip().lower()] = v.decode("latin-1").strip()
    if headers.get("transfer-encoding") == "chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body = out
    return status, headers, body


def metric_sum(sim: Proc, names: tuple[str, ...]) -> float:
    _, _, body = exchange(sim.port, request("GET", "/metrics"))
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(names):
            total += float(line.rsplit(" ", 1)[1])
    return total


COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total")


def engine_state(fleet: Fleet) -> tuple[float, float]:
    return metric_sum(fleet.prefill, COUNTERS), metric_sum(fleet.decode, COUNTERS)


def check(fleet: Fleet, method: str, status: int, headers: dict[str, str], body: bytes,
          before: tuple[float, float]) -> None:
    for p in fleet.procs:
        assert p.popen.poll() is None, f"{p.name} exited:\n{p.log()[-3000:]}"
    assert status < 500, f"{status}: {body[:500]!r}"
    if status >= 400 and method != "HEAD":
        err = json.loads(body)
        assert set(err) == {"error"}, err
        assert set(err["error"]) == {"message", "type", "param", "code"}, err
        assert isinstance(err["error"]["message"], str) and err["error"]["message"]
    if 400 <= status < 500:
        after = engine_state(fleet)
        assert after[1] == before[1], "a rejected request changed the decode engine's state"
        if method != "HEAD" and json.loads(body)["error"]["type"] in MOTOR_ERROR_TYPES:
            assert after == before, "a request refused by Motor reached an engine"


# --- strategies ----------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=30)
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                      max_leaves=12)
small_text = st.text(max_size=120)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | st.text(max_size=6),
     "content": small_text | values}), max_size=3)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from([MODEL, MODEL, "", "unknown", "m" * 300]) | values,
    "prompt": small_text | st.lists(st.integers(0, 2**31 - 1), max_size=40) | values,
    "messages": messages | values,
    "max_tokens": st.integers(-3, 24) | st.sampled_from([10**6, 2**63]) | values,
    "temperature": st.floats(-1, 3, allow_nan=False) | values,
    "top_p": st.floats(-1, 2, allow_nan=False),
    "n": st.integers(-1, 2),
    "stream": st.booleans() | values,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}) | values,
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3) | values,
    "seed": st.integers(-(2**65), 2**65),
    "logprobs": st.integers(-1, 5) | st.booleans(),
    "kv_transfer_params": values,
    "bootstrap_room": values,
    "extra": values,
}
OPTIONAL: dict[str, st.SearchStrategy[Any]] = {  # well typed, values in and out of range
    "max_tokens": st.integers(-3, 24) | st.sampled_from([10**6, 2**63]),
    "temperature": st.floats(-1, 3, allow_nan=False),
    "top_p": st.floats(-1, 2, allow_nan=False),
    "n": st.integers(-1, 2),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3),
    "seed": st.integers(-(2**65), 2**65),
    "logprobs": st.integers(-1, 5) | st.booleans(),
    "top_logprobs": st.integers(-1, 25),
    "presence_penalty": st.floats(-3, 3, allow_nan=False),
    "user": st.text(max_size=20),
}
# mostly-valid bodies reach the engines, where sampling fields are validated (and must stay < 500)
completion_body = st.fixed_dictionaries(
    {"model": st.just(MODEL), "prompt": st.text(min_size=1, max_size=80) | st.lists(st.integers(0, 2**31 - 1),
                                                                                       min_size=1, max_size=30)},
    optional=OPTIONAL)
chat_body = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(min_size=1, max_size=80)}),
        min_size=1, max_size=3)},
    optional=OPTIONAL)
any_fields = st.fixed_dictionaries({}, optional=FIELDS)
ROUTES = ["/v1/completions", "/v1/chat/completions"]
# (route, body): well-formed bodies go to their own route, the rest anywhere
routed_body = (completion_body.map(lambda b: ("/v1/completions", b))
               | chat_body.map(lambda b: ("/v1/chat/completions", b))
               | st.tuples(st.sampled_from(ROUTES), any_fields))


def deep_body(depth: int) -> bytes:
    return b'{"model": "tiny", "prompt": "x", "logit_bias": ' + b"[" * depth + b"]" * depth + b"}"


def sized_body(size: int) -> bytes:
    head = b'{"model": "tiny", "max_tokens": 2, "prompt": "'
    return head + b"a " * max(0, (size - len(head) - 2) // 2) + b'"}'


raw_bodies = st.tuples(st.sampled_from(ROUTES), (
    st.binary(max_size=200)
    | st.integers(1, 3000).map(deep_body)
    | st.integers(LIMIT - 2000, LIMIT + 4000).map(sized_body)
    | st.sampled_from([b"", b"null", b"[]", b'"x"', b"{", b'{"model": "tiny"}', b"\xef\xbb\xbf{}"])))
any_request = routed_body.map(lambda rb: (rb[0], json.dumps(rb[1]).encode())) | raw_bodies
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
                      max_size=200).map(lambda s: s.strip().encode("latin-1"))


# --- properties ----------------------------------------------------------------------------------


@fuzz_settings(120)
@given(req=any_request)
def test_any_body_on_the_openai_routes(fleet: Fleet, req: tuple[str, bytes]) -> None:
    route, body = req
    before = engine_state(fleet)
    status, headers, resp = exchange(fleet.gateway.port, request(
        "POST", route, body, {"Content-Type": b"application/json"}))
    check(fleet, "POST", status, headers, resp, before)


@fuzz_settings(60)
@given(req=routed_body.map(lambda rb: (rb[0], json.dumps(rb[1]).encode())),
       rid=st.none() | header_text, ctype=st.none() | st.sampled_from(
           [b"application/json", b"text/plain", b"multipart/form-data; boundary=x", b"application/json; charset=latin-1",
            b"application/x-www-form-urlencoded", b"\xff"]),
       encoding=st.none() | st.sampled_from(["gzip", "deflate", "identity", "br", "x-unknown", "gzip, gzip"]),
       really_compressed=st.booleans(), chunked=st.booleans(), auth=st.none() | header_text)
def test_any_headers_and_encodings(fleet: Fleet, req: tuple[str, bytes], rid: bytes | None, ctype: bytes | None,
                                   encoding: str | None, really_compressed: bool, chunked: bool,
                                   auth: bytes | None) -> None:
    route, body = req
    headers: dict[str, bytes] = {}
    for name, value in (("X-Request-Id", rid), ("Content-Type", ctype), ("Authorization", auth)):
        if value is not None:
            headers[name] = value
    if encoding is not None:
        headers["Content-Encoding"] = encoding.encode()
        if really_compressed and encoding in ("gzip", "deflate"):
            body = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    before = engine_state(fleet)
    status, resp_headers, resp = exchange(fleet.gateway.port, request("POST", route, body, headers, chunked=chunked))
    check(fleet, "POST", status, resp_headers, resp, before)
    rid_out = resp_headers.get("x-request-id", "")
    assert rid_out and rid_out.isascii() and rid_out.isprintable() and len(rid_out) <= 128


@fuzz_settings(50)
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
       path=st.sampled_from([*ROUTES, "/v1/models", "/v1/", "/v1/completions/x", "/health", "/ready", "/metrics",
                             "/v1/models?x=1", "/%ff", "/v1/chat/completions/../completions"]),
       body=st.binary(max_size=100))
def test_any_method_and_path(fleet: Fleet, method: str, path: str, body: bytes) -> None:
    before = engine_state(fleet)
    status, headers, resp = exchange(fleet.gateway.port, request(method, path, body))
    check(fleet, method, status, headers, resp, before)


def test_admission_is_back_to_zero_and_the_fleet_is_healthy(fleet: Fleet) -> None:
    status, _, body = exchange(fleet.gateway.port, request("GET", "/metrics"))
    assert status == 200
    text = body.decode()
    assert "motor_gateway_admission_in_flight 0.0" in text
    assert "motor_gateway_admission_queue_length 0.0" in text
    status, _, body = exchange(fleet.gateway.port, request(
        "POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "still serving", "max_tokens": 3}).encode(),
        {"Content-Type": b"application/json"}))
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"]


