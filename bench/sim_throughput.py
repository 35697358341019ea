"""Throughput of one zero-latency motor-sim process (not a test).

Starts ``motor-sim vllm serve`` with ``--sim-zero-latency`` on a free loopback port, drives it with
an asyncio aiohttp client at concurrency 1/16/64, non-streaming and streaming, and prints
requests/s and generated tokens/s. Total run time stays under a minute.

    .venv/bin/python bench/sim_throughput.py [--seconds 4] [--max-tokens 16] [--flavour vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson

from motor_common.ports import free_port


async def wait_healthy(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 20) -> None:
    deadline = time.monotonic() + deadline_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as s:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"motor-sim exited with {proc.returncode}")
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.05)
    raise SystemExit("motor-sim did not become healthy")


async def run_case(url: str, concurrency: int, stream: bool, seconds: float,
                   max_tokens: int) -> tuple[float, float, int]:
    body = {"model": "bench", "prompt": "benchmark the simulator please", "max_tokens": max_tokens,
            "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    payload = orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    done = tokens = errors = 0
    stop_at = time.monotonic() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)

    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        async def worker() -> None:
            nonlocal done, tokens, errors
            while time.monotonic() < stop_at:
                async with s.post(url + "/v1/completions", data=payload, headers=headers) as r:
                    if r.status != 200:
                        errors += 1
                        await r.read()
                        continue
                    if stream:
                        usage = None
                        async for line in r.content:
                            if line.startswith(b"data: {") and b'"usage":{' in line:
                                usage = orjson.loads(line[6:])["usage"]
                        tokens += usage["completion_tokens"] if usage else 0
                    else:
                        tokens += orjson.loads(await r.read())["usage"]["completion_tokens"]
                done += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    return done / elapsed, tokens / elapsed, errors


async def drive(url: str, proc: subprocess.Popen[bytes], args: argparse.Namespace) -> None:
    await wait_healthy(url, proc)
    print(f"motor-sim {args.flavour} zero-latency, max_tokens={args.max_tokens}, "
          f"{args.seconds:g}s per case, {os.cpu_count()} CPUs shared with the client")
    print(f"{'concurrency':>11} {'stream':>6} {'req/s':>9} {'tok/s':>10} {'errors':>6}")
    for stream in (False, True):
        for conc in (1, 16, 64):
            rps, tps, errs = await run_case(url, conc, stream, args.seconds, args.max_tokens)
            print(f"{conc:>11} {stream!s:>6} {rps:>9.0f} {tps:>10.0f} {errs:>6}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="per case (6 cases)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--flavour", choices=["vllm", "sglang"], default="vllm")
    args = ap.parse_args()
    port = free_port()
    exe = str(Path(sys.executable).with_name("motor-sim"))
    engine = ["vllm", "serve", "bench", "--max-num-seqs", "256"] if args.flavour == "vllm" else [
        "sglang", "--model-path", "bench", "--max-running-requests", "256"]
    proc = subprocess.Popen([exe, *engine, "--host", "127.0.0.1", "--port", str(port),
                             "--sim-zero-latency"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(drive(url, proc, args))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


if __name__ == "__main__":
    main()
