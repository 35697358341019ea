"""What each piece of the co-located front's own per-request work costs, end to end (not a test).

    flock /work/bench.lock .venv/bin/python bench/front_pieces.py [--pieces access_log,front_metrics,...]
                                          [--rounds 4] [--seconds 3] [--conc 1,64] [--stream]

Variants, each a co-located Motor (``motor-coordinator`` with ``http.port``, no gateway) started
from a scratch copy of this tree's packages (``PYTHONPATH``, as ``bench/tree_ab.py`` starts its
trees), except ``relay``:

- ``front`` / ``front-b``: the copy unchanged, under two labels (the A/A pair: the box's noise);
- ``-PIECE``: the copy with one piece of the front's own work taken out by a scratch patch
  (:data:`PIECES`: text replacements in the copied sources; nothing shipped has a switch for
  them); ``-all``: every piece out at once;
- ``relay``: ``bench/http_stack.py``'s bare aiohttp relay (the same hot-path shape, none of the
  front's own work): the floor.

The same two zero-latency simulators serve every variant. Per round each variant is started,
loaded at each concurrency with ``bench/loadgen.py`` for ``--seconds`` and stopped, in an order
that rotates per round. Prints every measurement, the medians with the paired ratios to ``front``
(``bench/http_stack.py``'s report) and, per piece, the CPU it costs: the median over the rounds
of ``front`` minus ``-PIECE`` within the round, in µs per request and as a share of ``front``.

``python bench/front_pieces.py micro [--n 20000] [--runs 5]`` times in process the cuts tried on
2026-12-02 (not kept: end to end they were below the box's noise), each written out here against
the tree's code: the access-log line without the caller/thread/process lookups and with one
strftime per second, for the JSON and the text format; the request id without a ``UUID`` object;
the scheduler's load guard as a plain async context object (2 per PD request).

A patch whose text is no longer in the tree fails the run (and ``tests/bench``) with the piece's
name: update :data:`PIECES` with the code it cuts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.http_stack import Results, report, rotation, start_relay  # noqa: E402

PACKAGES = ("common", "gateway", "services/coordinator")
_APP = "common/motor_common/openai_front/app.py"
_HTTP_FRONT = "services/coordinator/motor_coordinator/http_front.py"
_DISPATCHER = "services/coordinator/motor_coordinator/dispatcher.py"
_TRACE = "services/coordinator/motor_coordinator/dispatch_trace.py"
_MW = ("    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:\n")

# piece -> (file, text, replacement): each text must occur exactly once in its file.
Patch = tuple[str, str, str]
PIECES: dict[str, list[Patch]] = {
    # the access-log line (a LogRecord, the JSON formatter, a write) and the usage it reports
    "access_log": [
        (_APP, "            log_access(request.method, route, status, elapsed, access)\n", ""),
        (_APP, "                    request[ACCESS_KEY].usage_from_json(data)\n", "                    pass\n"),
        (_APP, "                access.usage_from_sse(chunk)\n", ""),
    ],
    # the front's motor_gateway_* metrics: in-flight gauge, request counter, latency histogram
    "front_metrics": [
        (_APP, "        in_flight.inc()\n", ""),
        (_APP, "            in_flight.dec()\n            _count(route, status)\n", ""),
        (_APP, "            _LATENCY[route].observe(elapsed)\n", ""),
    ],
    # the coordinator's per-request metrics (request_metrics.observed) and PD phase histograms
    "coord_metrics": [
        (_HTTP_FRONT, "return observed(self.app.dispatcher.dispatch(parsed, request_id, trace=incoming.get()), "
                      "parsed.model)", "return self.app.dispatcher.dispatch(parsed, request_id, trace=incoming.get())"),
        (_TRACE, "    child = _PHASES.get((model, role, phase))\n", "    return\n    child = None\n"),
    ],
    # a fresh uuid4 per request (the client sent no X-Request-Id)
    "request_id": [(_APP, "or new_request_id()", 'or "0123456789abcdef0123456789abcdef"')],
    # the request id's ContextVar, set and reset per request
    "contextvar": [
        (_APP, "        token = request_id_var.set(rid)\n", ""),
        (_APP, "            request_id_var.reset(token)\n", ""),
    ],
    # tracing off: the middleware's look for a traceparent, the carrier handed to the dispatcher
    "tracing": [
        (_APP, "if route in _TRACED and (TRACEPARENT in request.headers or tracer().enabled):", "if False:"),
        (_HTTP_FRONT, "trace=incoming.get())", "trace=())"),
    ],
    # admission: the front's queue/limits (acquire, release) and the coordinator's role check
    "admission": [
        (_APP, "ticket = await self.admission.acquire(model, request[API_KEY_ID], len(raw))", "ticket = None"),
        (_APP, "            self.admission.release(ticket)\n", "            pass\n"),
        (_HTTP_FRONT, "        admit(self.app, degraded_hint=False)\n", ""),
    ],
    # timers: the dispatcher's first-byte watchdog (two per PD request), the body-read timeout
    "timers": [
        (_DISPATCHER, "if self.cfg.health_probe_interval_sec > 0 else aw)", "if False else aw)"),
        (_APP, "async with asyncio.timeout(self.limits.body_timeout_sec):", "if True:"),
    ],
    # the Server header (an on_response_prepare signal handler per response)
    "server_header": [(_APP, "        app.on_response_prepare.append(_server_header)\n", "")],
    # everything the middleware does (metrics, access log, request id, auth, tracing, contextvar)
    "middleware": [(_APP, _MW, _MW + "        request[REQUEST_ID_KEY] = '0123456789abcdef0123456789abcdef'\n"
                                      "        request[ACCESS_KEY] = Access()\n"
                                      "        request[API_KEY_ID] = ANONYMOUS\n"
                                      "        return await handler(request)\n")],
}


def patched(text: str, piece: str, patches: Sequence[Patch], path: str) -> str:
    """*text* (the file *path*) with *piece*'s patches of that file applied."""
    for file, old, new in patches:
        if file != path:
            continue
        n = text.count(old)
        if n != 1:
            raise ValueError(f"piece {piece!r}: {old.strip()[:60]!r} occurs {n} times in {file}, not once: "
                             "update bench/front_pieces.py's PIECES")
        text = text.replace(old, new)
    return text


def scratch_tree(src: Path, dst: Path, pieces: Sequence[str]) -> Path:
    """A copy of *src*'s packages in *dst* with *pieces* taken out; returns *dst*."""
    for pkg in PACKAGES:
        shutil.copytree(src / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so"))
    for piece in pieces:
        for path in sorted({p[0] for p in PIECES[piece]}):
            f = dst / path
            f.write_text(patched(f.read_text(), piece, PIECES[piece], path))
    return dst


def variants(pieces: Sequence[str]) -> list[str]:
    return ["front", "front-b", "relay", *(f"-{p}" for p in pieces), "-all"]


def costs(res: Results, pieces: Sequence[str], conc: Sequence[int]) -> str:
    """Per piece and concurrency: front - (front without it), µs per request, median of the rounds."""
    lines = ["what each piece costs (median over rounds of front - variant, same round):"]
    for c in conc:
        front = res.get(("front", c), [])
        full = statistics.median(x[0] for x in front) if front else 0.0
        for v in ("front-b", "relay", *(f"-{p}" for p in pieces), "-all"):
            diffs = [f[0] - x[0] for f, x in zip(front, res.get((v, c), []), strict=False)]
            if not diffs or full <= 0:
                continue
            d = statistics.median(diffs)
            lines.append(f"  c={c:<3} {v:16} {d:7.0f} us/req  {d / full * 100:5.1f}% of front"
                         f"  [{min(diffs):.0f} .. {max(diffs):.0f}]")
    return "\n".join(lines)


async def bench(a: argparse.Namespace) -> Results:
    from bench.ab import measure
    from bench.common import ZERO, start_engines, start_motor

    res: Results = {}
    names = variants(a.pieces)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        trees = {"front": scratch_tree(ROOT, d / "front", [])}
        trees["front-b"] = trees["front"]
        for p in a.pieces:
            trees[f"-{p}"] = scratch_tree(ROOT, d / p, [p])
        trees["-all"] = scratch_tree(ROOT, d / "all", [p for p in a.pieces if p != "middleware"] +
                                     (["middleware"] if "middleware" in a.pieces else []))
        async with start_engines("vllm", d, ZERO) as e:
            prefill, decode = e.prefills[0].url, e.decodes[0].url
            print(f"load average at start: {os.getloadavg()}", flush=True)
            for rnd in range(a.rounds):
                for v in rotation(names, rnd):
                    if v == "relay":
                        target = start_relay("aiohttp", prefill, decode, d)
                    else:
                        saved = os.environ.get("PYTHONPATH")
                        os.environ["PYTHONPATH"] = os.pathsep.join(str(trees[v] / p) for p in PACKAGES)
                        try:
                            target = start_motor(e, d, name=v, co_located=True)
                        finally:
                            if saved is None:
                                os.environ.pop("PYTHONPATH", None)
                            else:
                                os.environ["PYTHONPATH"] = saved
                    async with target as t:
                        await measure(t, v, rnd, a.conc, a.stream, a.seconds, res, width=16)
            print(f"load average at end: {os.getloadavg()}", flush=True)
    print(report(res, names, a.conc), flush=True)
    print(costs(res, a.pieces, a.conc), flush=True)
    return res


# -- in process: what the cuts tried on 2026-12-02 would remove (not kept: below the box's noise) ----
# "before" is this tree's code; "after" is each cut written out here.
_UUID4_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))  # uuid4's version and variant bits
_UUID4_SET = (0x8000 << 48) | (4 << 76)


def _fast_request_id() -> str:
    """``uuid.uuid4().hex`` without the ``UUID`` object."""
    return f"{(int.from_bytes(os.urandom(16), 'big') & _UUID4_CLEAR) | _UUID4_SET:032x}"


def _cached_time(base: type[logging.Formatter]) -> type[logging.Formatter]:
    """*base* (the text formatter) with one strftime per second in ``formatTime``."""

    class Cached(base):  # type: ignore[valid-type,misc]
        _second, _stamp = -1, ""

        def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
            second = int(record.created)
            if second != self._second:
                self._stamp, self._second = time.strftime(self.default_time_format, self.converter(second)), second
            return f"{self._stamp},{int(record.msecs):03d}"

    return Cached


def _access_line_us(fmt: str, cut: bool, n: int, out: Path) -> float:
    from motor_common.logs import TextFormatter, request_id_var, setup_logging
    from motor_common.openai_front.access_log import Access, log_access

    saved = sys.stderr
    flags = (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    with out.open("w") as sys.stderr:
        setup_logging("coordinator", fmt=fmt)  # this tree's settings
        if cut:  # the logging HOWTO's "Optimization" settings, and a strftime per second
            logging._srcfile = None
            logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
            if fmt == "text":
                logging.getLogger().handlers[0].setFormatter(_cached_time(TextFormatter)("coordinator"))
        token = request_id_var.set("0123456789abcdef0123456789abcdef")
        a = Access(model="bench", stream=False, prompt_tokens=5, completion_tokens=16)
        strftime = time.strftime
        if cut and fmt == "json":  # JsonFormatter's strftime per line, as if cached per second
            stamp = strftime("%Y-%m-%dT%H:%M:%S")
            time.strftime = lambda *_: stamp  # type: ignore[assignment]
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                log_access("POST", "/v1/completions", 200, 0.0012, a)
            us = (time.perf_counter() - t0) / n * 1e6
        finally:
            time.strftime = strftime
            request_id_var.reset(token)
            logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = flags
    sys.stderr = saved
    return us


def _request_id_us(cut: bool, n: int) -> float:
    from motor_common.logs import new_request_id

    make = _fast_request_id if cut else new_request_id
    t0 = time.perf_counter()
    for _ in range(n):
        make()
    return (time.perf_counter() - t0) / n * 1e6


class _Guard:
    """The load guard as a plain async context object (what the cut made of ``load_guard``)."""

    __slots__ = ("_s",)

    def __init__(self, s: Any) -> None:
        self._s = s

    async def __aenter__(self) -> None:
        self._s.enter()

    async def __aexit__(self, *exc: object) -> None:
        self._s.exit()


class _NoLoad:
    def enter(self) -> None:
        pass

    def exit(self) -> None:
        pass


@asynccontextmanager
async def _generator_guard(s: _NoLoad) -> AsyncIterator[None]:
    """``Scheduler.load_guard``'s shape in this tree: an ``asynccontextmanager`` generator."""
    s.enter()
    try:
        yield
    finally:
        s.exit()


async def _guard_us(cut: bool, n: int) -> float:
    s = _NoLoad()
    t0 = time.perf_counter()
    for _ in range(n):
        async with (_Guard(s) if cut else _generator_guard(s)):
            pass
    return (time.perf_counter() - t0) / n * 1e6


def micro(n: int, runs: int) -> dict[str, tuple[float, float]]:
    """Per item: the median over *runs* of (before, after) µs per request; runs interleave."""
    import uvloop

    got: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            for fmt in ("json", "text"):
                got.setdefault(f"access-log line ({fmt})", []).append(
                    (_access_line_us(fmt, False, n, Path(tmp) / "a.log"), _access_line_us(fmt, True, n, Path(tmp) / "b.log")))
            got.setdefault("request id", []).append((_request_id_us(False, n), _request_id_us(True, n)))
            got.setdefault("load guard (x2 per PD request)", []).append(
                (uvloop.run(_guard_us(False, n)), uvloop.run(_guard_us(True, n))))
    out = {k: (statistics.median(b for b, _ in v), statistics.median(a for _, a in v)) for k, v in got.items()}
    for k, (b, a) in out.items():
        print(f"  {k:32} before {b:6.2f} us  after {a:6.2f} us  saved {b - a:6.2f} us", flush=True)
    return out


def _csv(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _pieces(text: str) -> list[str]:
    out = _csv(text)
    unknown = [p for p in out if p not in PIECES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown piece(s) {', '.join(unknown)}; known: {', '.join(PIECES)}")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    mi = sub.add_parser("micro", help="in process: what the tried cuts remove, tree vs cut")
    mi.add_argument("--n", type=int, default=20000)
    mi.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pieces", type=_pieces, default=list(PIECES))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--conc", type=lambda t: [int(x) for x in _csv(t)], default=[1, 64])
    ap.add_argument("--stream", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "micro":
        print(f"load average: {os.getloadavg()}", flush=True)
        micro(a.n, a.runs)
        return
    from motor_common.runner import install_uvloop

    install_uvloop()
    asyncio.run(bench(a))


if __name__ == "__main__":
    main()
