"""Does a different HTTP server stack make the co-located front's relay cheaper? (not a test)

    .venv/bin/pip install granian pyreqwest   # the candidates, into the venv only (not dependencies)
    flock /work/bench.lock .venv/bin/python bench/http_stack.py [--stacks aiohttp,aiohttp-b,granian,aiohttp+reqwest]
                                          [--rounds 6] [--seconds 3] [--conc 1,64] [--stream]

A minimal relay with the shape of the co-located front's hot path and nothing else: accept
``POST /v1/completions``, parse the JSON with orjson, send the vLLM prefill body (``max_tokens`` 1,
``do_remote_decode``) to a prefill simulator with aiohttp's client (one session, keep-alive: what
the coordinator's ``EngineClient`` used until 2026-12-03), then the decode body with the returned ``kv_transfer_params`` to a
decode simulator, and relay the decode answer: whole (non-streamed) or chunk by chunk as the
engine's reads return them (streamed, as the dispatcher's ``readany`` loop does). No admission,
auth, metrics or scheduling: what differs between the variants is only the server side.

Stacks (each a separate relay process, measured by its process tree's CPU, psutil):
- ``aiohttp`` / ``aiohttp-b``: ``aiohttp.web`` on uvloop, ``web.Response`` / ``StreamResponse``
  as the front answers (two labels of the same code: the A/A pair that shows the box's noise);
- ``aiohttp-1w``: the same, but a streamed answer's last chunk (the one ending with
  ``data: [DONE]``) is sent with the chunked terminator in one write (``write_eof(chunk)``); aiohttp
  already sends a non-streamed answer's head and body in one write, and a stream's head with its
  first chunk;
- ``granian``: granian's RSGI interface (Rust HTTP/1.1 server, 1 worker, uvloop, the Rust runtime
  in single-threaded mode) with the same relay coroutine and the same aiohttp engine client;
  ``granian-rt``: the same with ``--task-impl rust`` (granian's own task implementation);
- ``SERVER+reqwest`` (``aiohttp+reqwest``, ``granian+reqwest``): the engine legs through pyreqwest
  (Rust reqwest client) instead of aiohttp's client: the client-stack candidate;
  ``aiohttp+reqwest-p``: only the prefill leg (a whole answer in every request) through pyreqwest;
- ``raw``: no framework on either side (``bench/raw_relay.py``: asyncio protocols, httptools
  parsing, prepared bytes, a keep-alive pool per engine; needs ``pip install httptools``): the
  floor of a Python relay on uvloop; ``raw+aiohttp``: that server with the aiohttp
  client; ``aiohttp+raw``: ``aiohttp.web`` with the raw engine client (which side buys what);
- ``aiohttp+engine``: ``aiohttp.web`` with the coordinator's own ``EngineClient``, whose dispatch
  legs run on ``motor_coordinator.engine_http`` since 2026-12-03 (what the co-located front ships);
- ``hop``: the gateway topology's floor, two processes (``bench/hop_relay.py``): an
  ``aiohttp.web`` front sending each body on one grpc.aio stream (batched, as ``DispatchMany``) to
  a back process that runs the ``engine`` client's two legs; the CPU of both is its cost. Nothing
  of Motor's own per-request work on either side. ``hop-grpclib``: the same stream on grpclib (pure
  Python HTTP/2 on asyncio, no threads; ``pip install grpclib``, not a dependency);
- ``vllm-router``: not a relay of this file but the peer itself (vllm-router, round robin, from
  ``.bench/routers-venv``, ``scripts/routers-setup``) in front of the same two engines: the
  reference the others are read against, measured in the same rounds;
- ``motor`` / ``motor-co``: Motor itself in front of the same engines (``bench/common.py``'s
  ``start_motor``: gateway + coordinator, what ``motor up`` starts / the co-located front), so the
  floors above and the product are measured in the same rounds.

The same two simulators (zero latency) serve every variant. Per round each variant is started,
loaded at each concurrency with ``bench/loadgen.py`` for ``--seconds`` and stopped, in an order
that rotates per round, so load drift on the box biases none. Prints every measurement, the medians
and the paired ratios (variant ÷ ``aiohttp`` within each round).

``python bench/http_stack.py serve --stack aiohttp --port P --prefill URL --decode URL`` runs one
relay (what the benchmark starts); granian imports ``bench.http_stack:rsgi_app`` and reads the
engine URLs from ``HTTP_STACK_PREFILL`` / ``HTTP_STACK_DECODE``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from motor_common.domain import Endpoint  # noqa: E402
from motor_coordinator.config import DispatchConfig  # noqa: E402
from motor_coordinator.engine_client import EngineClient  # noqa: E402

STACKS = ("aiohttp", "aiohttp-b", "aiohttp-1w", "granian", "granian-rt", "aiohttp+reqwest", "granian+reqwest",
          "aiohttp+reqwest-p", "raw", "raw+aiohttp", "aiohttp+raw", "aiohttp+engine", "hop", "hop-grpclib", "vllm-router",
          "motor", "motor-co")
# Motor itself, in front of the same engines: gateway + coordinator (what `motor up` starts), and the
# coordinator's co-located front
MOTOR = {"motor": False, "motor-co": True}
PATH = "/v1/completions"
_JSON = "application/json"
_KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
       "remote_block_ids": None, "remote_host": None, "remote_port": None}


# --- the relay (framework-neutral) -------------------------------------------------------------
def endpoint(url: str, ident: int) -> Endpoint:
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"engine URL needs a host and a port: {url!r}")
    return Endpoint(ident, parts.hostname, parts.port)


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The vLLM prefill leg's body, as the vLLM adapter rewrites it."""
    out = dict(body, stream=False, max_tokens=1, kv_transfer_params=_KV)
    out.pop("stream_options", None)
    return out


class Relay:
    """Prefill then decode through aiohttp's client (one ``ClientSession``, keep-alive, as the
    coordinator's ``EngineClient`` used it for the engine legs until 2026-12-03); answers
    (status, content type, chunks)."""

    def __init__(self, prefill: str, decode: str) -> None:
        self.prefill_url = prefill + PATH
        self.decode_url = decode + PATH
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self.session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=DispatchConfig().engine_keepalive_sec)
            self.session = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def _decode(self, body: dict[str, Any], kv: Any, rid: str) -> tuple[int, str, AsyncIterator[bytes]]:
        assert self.session is not None
        resp = await self.session.post(self.decode_url, data=orjson.dumps(dict(body, kv_transfer_params=kv)),
                                       headers={"Content-Type": _JSON, "X-Request-Id": rid})
        return resp.status, resp.headers.get("Content-Type", _JSON), _chunks(resp)

    async def open(self, raw: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        await self.start()
        assert self.session is not None
        rid = uuid.uuid4().hex
        body = orjson.loads(raw)
        async with self.session.post(self.prefill_url, data=orjson.dumps(prefill_body(body)),
                                     headers={"Content-Type": _JSON, "X-Request-Id": rid}) as r:
            status, data = r.status, await r.read()
        if status != 200:
            return status, _JSON, _one(data)
        return await self._decode(body, orjson.loads(data).get("kv_transfer_params"), rid)


class EngineClientRelay(Relay):
    """The same two legs through the coordinator's own ``EngineClient`` (since 2026-12-03 its
    dispatch legs run on ``engine_http``: asyncio protocols, httptools): the shipped client."""

    def __init__(self, prefill: str, decode: str) -> None:
        super().__init__(prefill, decode)
        self.prefill = endpoint(prefill, 1)
        self.decode = endpoint(decode, 2)
        self.client = EngineClient(connect_timeout=5.0, probe_timeout=5.0,
                                   keepalive=DispatchConfig().engine_keepalive_sec)
        self._started = False

    async def start(self) -> None:
        if not self._started:
            await self.client.start()
            self._started = True

    async def close(self) -> None:
        await self.client.close()

    async def open(self, raw: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        await self.start()
        rid = uuid.uuid4().hex
        body = orjson.loads(raw)
        status, _, data = await self.client.read_all(self.prefill, PATH, prefill_body(body), rid)
        if status != 200:
            return status, _JSON, _one(data)
        kv = orjson.loads(data).get("kv_transfer_params")
        resp = await self.client.open(self.decode, PATH, dict(body, kv_transfer_params=kv), rid)
        return resp.status, resp.headers.get("Content-Type", _JSON), _chunks(resp)


class ReqwestRelay(Relay):
    """The same two legs through pyreqwest (Rust reqwest/hyper client, its own Tokio runtime
    thread) instead of aiohttp's client: the client-stack candidate."""

    def __init__(self, prefill: str, decode: str) -> None:
        super().__init__(prefill, decode)
        self._reqwest: Any = None

    async def start(self) -> None:
        if self._reqwest is None:
            from pyreqwest.client import ClientBuilder

            self._reqwest = ClientBuilder().build()

    async def close(self) -> None:
        if self._reqwest is not None:
            await self._reqwest.close()

    def _post(self, url: str, body: dict[str, Any], rid: str) -> Any:
        return (self._reqwest.post(url).header("Content-Type", _JSON).header("X-Request-Id", rid)
                .body_bytes(orjson.dumps(body)).timeout(_TIMEOUT))

    async def _prefill(self, raw: bytes) -> tuple[str, dict[str, Any], int, bytes]:
        """The prefill leg through pyreqwest: (request id, the request's body, status, answer)."""
        await self.start()
        rid = uuid.uuid4().hex
        body = orjson.loads(raw)
        resp = await self._post(self.prefill_url, prefill_body(body), rid).build().send()
        return rid, body, resp.status, bytes(await resp.bytes())

    async def open(self, raw: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        rid, body, status, data = await self._prefill(raw)
        if status != 200:
            return status, _JSON, _one(data)
        kv = orjson.loads(data).get("kv_transfer_params")
        call = self._post(self.decode_url, dict(body, kv_transfer_params=kv), rid).build_streamed()
        resp = await call.__aenter__()
        return resp.status, resp.headers.get("content-type", _JSON), _reqwest_chunks(call, resp)


class PrefillReqwestRelay(ReqwestRelay):
    """The prefill leg (always a whole, non-streamed answer) through pyreqwest, the decode leg
    through the aiohttp ``EngineClient``."""

    async def start(self) -> None:
        await ReqwestRelay.start(self)
        await Relay.start(self)

    async def close(self) -> None:
        await ReqwestRelay.close(self)
        await Relay.close(self)

    async def open(self, raw: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        rid, body, status, data = await self._prefill(raw)
        if status != 200:
            return status, _JSON, _one(data)
        return await self._decode(body, orjson.loads(data).get("kv_transfer_params"), rid)


_TIMEOUT = timedelta(seconds=60)


def make_relay(client: str, prefill: str, decode: str) -> Relay:
    if client == "aiohttp":
        return Relay(prefill, decode)
    if client == "reqwest":
        return ReqwestRelay(prefill, decode)
    if client == "reqwest-p":
        return PrefillReqwestRelay(prefill, decode)
    if client == "engine":
        return EngineClientRelay(prefill, decode)
    if client == "raw":
        from bench.raw_relay import RawRelay

        return RawRelay(prefill, decode)  # type: ignore[return-value]  # the same open/start/close
    raise ValueError(f"unknown engine client {client!r}; known: aiohttp, engine, reqwest, reqwest-p, raw")


async def _reqwest_chunks(call: Any, resp: Any) -> AsyncIterator[bytes]:
    try:
        reader = resp.body_reader
        while (chunk := await reader.read_chunk()) is not None:
            yield bytes(chunk)
    finally:
        await call.__aexit__(None, None, None)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _chunks(resp: Any) -> AsyncIterator[bytes]:
    try:
        while chunk := await resp.content.readany():
            yield chunk
    finally:
        resp.release()


def _is_sse(ctype: str) -> bool:
    return ctype.startswith("text/event-stream")


# --- aiohttp.web --------------------------------------------------------------------------------
_LAST_EVENT = b"data: [DONE]\n\n"


def aiohttp_app(relay: Relay, *, last_with_eof: bool = False) -> Any:
    """*last_with_eof*: the chunk that ends with the ``[DONE]`` event goes out with the chunked
    terminator (``write_eof(chunk)``: one socket write instead of two; with the head too when it is
    the only chunk)."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        status, ctype, chunks = await relay.open(await request.read())
        headers = {"Content-Type": ctype}
        if not _is_sse(ctype):
            return web.Response(status=status, body=b"".join([c async for c in chunks]), headers=headers)
        resp = web.StreamResponse(status=status, headers=headers)
        resp.headers["Cache-Control"] = "no-cache"
        await resp.prepare(request)
        async for chunk in chunks:
            if last_with_eof and chunk.endswith(_LAST_EVENT):
                await resp.write_eof(chunk)
            else:
                await resp.write(chunk)
        await resp.write_eof()  # a no-op after write_eof(chunk)
        return resp

    async def on_cleanup(_: web.Application) -> None:
        await relay.close()

    app = web.Application()
    app.router.add_post(PATH, completions)
    app.on_cleanup.append(on_cleanup)
    return app


# --- granian RSGI -------------------------------------------------------------------------------
class RsgiApp:
    """The relay as an RSGI application (granian imports the module-level :data:`rsgi_app`)."""

    def __init__(self) -> None:
        self.relay: Relay | None = None

    def _relay(self) -> Relay:
        if self.relay is None:
            self.relay = make_relay(os.environ.get("HTTP_STACK_CLIENT", "aiohttp"), os.environ["HTTP_STACK_PREFILL"],
                                    os.environ["HTTP_STACK_DECODE"])
        return self.relay

    async def __call__(self, scope: Any, proto: Any) -> None:
        if scope.method != "POST" or scope.path != PATH:
            proto.response_bytes(404, [("content-type", _JSON)], b'{"error":"not found"}')
            return
        status, ctype, chunks = await self._relay().open(await proto())
        if not _is_sse(ctype):
            proto.response_bytes(status, [("content-type", ctype)], b"".join([c async for c in chunks]))
            return
        transport = proto.response_stream(status, [("content-type", ctype), ("cache-control", "no-cache")])
        async for chunk in chunks:
            await transport.send_bytes(chunk)


rsgi_app = RsgiApp()


def serve_aiohttp(port: int, client: str, prefill: str, decode: str, *, last_with_eof: bool = False) -> None:
    from aiohttp import web

    from motor_common.runner import install_uvloop

    install_uvloop()
    web.run_app(aiohttp_app(make_relay(client, prefill, decode), last_with_eof=last_with_eof), host="127.0.0.1", port=port, access_log=None,
                print=None)


# --- the benchmark ------------------------------------------------------------------------------
def split_stack(stack: str) -> tuple[str, str]:
    """``server[+client]`` -> (server, engine client); the client defaults to aiohttp."""
    server, _, client = stack.partition("+")
    return server, client or "aiohttp"


def relay_argv(stack: str, port: int) -> list[str]:
    if stack not in STACKS or stack in MOTOR:
        raise ValueError(f"unknown stack {stack!r}; known: {', '.join(STACKS)}")
    server, client = split_stack(stack)
    if server.startswith("aiohttp"):
        return [sys.executable, str(Path(__file__).resolve()), "serve", "--stack",
                "aiohttp-1w" if server == "aiohttp-1w" else "aiohttp", "--client", client,
                "--port", str(port)]
    if server == "raw":
        return [sys.executable, str(Path(__file__).resolve().with_name("raw_relay.py")), "--client",
                client if "+" in stack else "raw", "--port", str(port)]
    if server.startswith("hop"):  # its front process; start_relay starts the back and adds --back
        return [sys.executable, str(Path(__file__).resolve().with_name("hop_relay.py")), "front", "--port", str(port),
                "--transport", "grpclib" if server == "hop-grpclib" else "grpcio"]
    if server == "vllm-router":
        from bench.common import ensure_routers_venv

        return [str(ensure_routers_venv() / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--vllm-pd-disaggregation", "--policy", "round_robin"]
    if server in ("granian", "granian-rt"):
        rust_tasks = ["--task-impl", "rust"] if server == "granian-rt" else []
        return [sys.executable, "-m", "granian", "--interface", "rsgi", "--host", "127.0.0.1", "--port", str(port),
                "--workers", "1", "--runtime-mode", "st", "--loop", "uvloop", *rust_tasks, "--no-ws",
                "--no-access-log", "--log-level", "warning", "bench.http_stack:rsgi_app"]
    raise ValueError(f"unknown stack {stack!r}; known: {', '.join(STACKS)}")


Results = dict[tuple[str, int], list[tuple[float, float, float]]]  # -> (cpu us/req, req/s, p50 ms) per round


def rotation(stacks: Sequence[str], rnd: int) -> list[str]:
    """Round *rnd*'s order: the list rotated by one per round (each stack goes first in turn)."""
    k = rnd % len(stacks)
    return [*stacks[k:], *stacks[:k]]


def paired(res: Results, stack: str, base: str, conc: int, col: int = 0) -> list[float]:
    """Per-round ratios *stack* ÷ *base* of column *col* (0: CPU per request, 1: req/s)."""
    return [x[col] / b[col] for x, b in zip(res.get((stack, conc), []), res.get((base, conc), []), strict=False)
            if b[col] > 0]


def report(res: Results, stacks: Sequence[str], conc: Sequence[int]) -> str:
    base = stacks[0]
    lines = ["medians (paired ratio = median of the per-round ratios to " + base + "):"]
    for c in conc:
        for s in stacks:
            xs = res.get((s, c), [])
            if not xs:
                continue
            cpu = statistics.median(x[0] for x in xs)
            rps = statistics.median(x[1] for x in xs)
            p50 = statistics.median(x[2] for x in xs)
            line = f"  c={c:<3} {s:16} cpu/1k {cpu / 1e3:6.2f}s  rps {rps:7.0f}  p50 {p50:6.2f}ms"
            if s != base:
                rc, rr = paired(res, s, base, c, 0), paired(res, s, base, c, 1)
                if rc:
                    line += (f"  cpu x{statistics.median(rc):.2f} [{min(rc):.2f}-{max(rc):.2f}]"
                             f"  rps x{statistics.median(rr):.2f} [{min(rr):.2f}-{max(rr):.2f}]")
            lines.append(line)
    return "\n".join(lines)


@dataclass
class Relayed:
    """A started relay: where to send requests, and the processes whose CPU is its cost."""

    url: str
    pids: list[int]


def _listening(port: int) -> Any:
    def ready(_: Any) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    return ready


@asynccontextmanager
async def start_relay(stack: str, prefill: str, decode: str, log_dir: Path) -> AsyncIterator[Relayed]:
    from bench.common import _serves_completions
    from tests.helpers import free_port
    from tests.procs import running

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    argv = relay_argv(stack, port)
    if stack.startswith("hop"):  # two processes: bench/hop_relay.py's back (engine legs) and front (aiohttp.web)
        back_port = free_port()
        back_argv = [*argv[:2], "back", "--port", str(back_port), "--prefill", prefill, "--decode", decode,
                     *argv[-2:]]
        async with running("hop-back", back_argv, log_dir, ready=_listening(back_port), env=env) as back, \
                running("hop-front", [*argv, "--back", f"127.0.0.1:{back_port}"], log_dir,
                        ready=_serves_completions(port), deadline=60, env=env) as front:
            yield Relayed(front.url, [front.pid, back.pid])
        return
    if stack.startswith(("aiohttp", "raw")):
        argv += ["--prefill", prefill, "--decode", decode]
    elif stack == "vllm-router":
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                 "--prefill", prefill, "--decode", decode]
    env.update(HTTP_STACK_PREFILL=prefill, HTTP_STACK_DECODE=decode, HTTP_STACK_CLIENT=split_stack(stack)[1])
    async with running(f"relay-{stack}", argv, log_dir, ready=_serves_completions(port), deadline=60, env=env) as p:
        yield Relayed(p.url, [p.pid])


async def bench(a: argparse.Namespace) -> Results:
    from bench.ab import measure
    from bench.common import ZERO, start_engines, start_motor

    res: Results = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        async with start_engines("vllm", d, ZERO) as e:
            prefill, decode = e.prefills[0].url, e.decodes[0].url
            print(f"load average at start: {os.getloadavg()}", flush=True)
            for rnd in range(a.rounds):
                for stack in rotation(a.stacks, rnd):
                    target = (start_motor(e, d, name=stack, co_located=MOTOR[stack]) if stack in MOTOR
                              else start_relay(stack, prefill, decode, d))
                    async with target as p:
                        await measure(p, stack, rnd, a.conc, a.stream, a.seconds, res, width=16)
            print(f"load average at end: {os.getloadavg()}", flush=True)
    print(report(res, a.stacks, a.conc), flush=True)
    return res


def _csv(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    sv = sub.add_parser("serve", help="run one aiohttp relay (what the benchmark starts)")
    sv.add_argument("--stack", choices=["aiohttp", "aiohttp-1w"], default="aiohttp")
    sv.add_argument("--client", choices=["aiohttp", "engine", "reqwest", "reqwest-p", "raw"], default="aiohttp")
    sv.add_argument("--port", type=int, required=True)
    sv.add_argument("--prefill", required=True)
    sv.add_argument("--decode", required=True)
    ap.add_argument("--stacks", type=_csv, default=["aiohttp", "aiohttp-b", "granian", "aiohttp+reqwest"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--conc", type=lambda t: [int(x) for x in _csv(t)], default=[1, 64])
    ap.add_argument("--stream", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "serve":
        serve_aiohttp(a.port, a.client, a.prefill, a.decode, last_with_eof=a.stack == "aiohttp-1w")
        return
    for s in a.stacks:
        if s not in MOTOR:
            relay_argv(s, 0)  # an unknown stack fails before any process starts
    from motor_common.runner import install_uvloop

    install_uvloop()
    start = time.time()
    asyncio.run(bench(a))
    print(f"took {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
