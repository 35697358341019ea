"""KV-event routing end to end (issue 19): `motor up --kv-events`, real processes throughout, with
vLLM-protocol and SGLang-protocol simulated engines (each engine's own event format and hashing).

Nodemanagers launch motor-sim engines with `--kv-events-config` and announce the ports; the
controller carries them to the coordinator, which subscribes to every prefill engine and routes
prefill by the blocks each engine reports. The test checks, against the engines' own counters and
their own event streams:

- a repeated prefix goes to the engine that holds it (its prefix-cache hits grow, the other
  engine never sees the prompt);
- after the holder evicted the prefix (a flood of unique prompts, KV capacity 64 blocks), the
  coordinator's index equals what the engine's event stream says it holds, and the prefix is
  routed as cold (by the ring);
- after the holder's engine is killed and relaunched on the same ports, the index holds nothing
  for it, and the prefix is cold again.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psutil
import pytest
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from motor_common import toy_tokenizer
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Flavour,
    block_hashes,
    decode_batch,
    seq_bytes,
)
from tests.helpers import wait_for
from tests.motor_up import UpFleet, motor_up

pytestmark = pytest.mark.slow

SYSTEM = "You are the helpful assistant of the Motor project. Answer briefly and exactly. " * 6
_IDS = toy_tokenizer.encode(toy_tokenizer.render_chat([{"role": "system", "content": SYSTEM},
                                                       {"role": "user", "content": "x"}]))
# The system prompt's first KV block, hashed the way the engines (and the coordinator) hash it.
FIRST_BLOCK = {fl: block_hashes(fl, _IDS, 16)[0] for fl in Flavour}


async def _metrics(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with aiohttp.ClientSession() as http, http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        text = await resp.text()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


class KvFleet:
    def __init__(self, up: UpFleet, flavour: Flavour) -> None:
        self.up = up
        self.flavour = flavour
        ports = json.loads((up.state / "coordinator.ports.json").read_text())
        self.coordinator_metrics = f"http://127.0.0.1:{ports['metrics']}/metrics"
        self.client = openai.AsyncOpenAI(base_url=up.info["gateway_url"] + "/v1", api_key="unused",
                                         max_retries=0, timeout=20)  # fmt: skip

    async def prefill_endpoints(self) -> dict[str, Any]:
        """Candidate key -> the endpoint message, for every prefill endpoint the coordinator lists."""
        key = Path(self.up.info["management_key_file"]).read_text().strip()
        async with open_channel(self.up.info["coordinators"][0]) as ch:
            resp = await cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
                cpb.ListInstancesRequest(), metadata=call_metadata(key), timeout=5)
        out = {}
        for inst in resp.instances:
            if inst.role == 1:  # ROLE_PREFILL
                for ep in inst.endpoints:
                    out[f"{inst.id}/{ep.ip}:{ep.business_port}"] = ep
        return out

    async def index(self) -> dict[str, tuple[float, float]]:
        """Engine key -> (blocks held per the coordinator's index, stale)."""
        m = await _metrics(self.coordinator_metrics)
        blocks = {lb["engine"]: v for lb, v in m.get("motor_coordinator_kv_index_blocks", [])}
        stale = {lb["engine"]: v for lb, v in m.get("motor_coordinator_kv_index_stale", [])}
        return {k: (blocks[k], stale.get(k, 1.0)) for k in blocks}

    async def decisions(self) -> dict[str, float]:
        m = await _metrics(self.coordinator_metrics)
        return {lb["decision"]: v for lb, v in m.get("motor_coordinator_kv_events_decisions_total", [])}

    async def chat(self, user: str, system: str = SYSTEM) -> None:
        resp = await self.client.chat.completions.create(
            model="tiny", max_tokens=2,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])  # fmt: skip
        assert resp.choices[0].message.content

    def engine_pid(self, business_port: int) -> int:
        for child in psutil.Process(self.up.proc.pid).children(recursive=True):
            try:
                argv = child.cmdline()
            except psutil.Error:
                continue
            if any("motor-sim" in a or "motor_sim" in a for a in argv) and str(business_port) in argv:
                return int(child.pid)
        raise AssertionError(f"no engine on port {business_port}")


async def _engine_counters(port: int) -> tuple[float, float]:
    """(prompt tokens queried, prefix-cache hit tokens) from the engine's own /metrics (SGLang
    reports a cumulative hit rate and the prompt tokens)."""
    m = await _metrics(f"http://127.0.0.1:{port}/metrics")
    if "sglang:prompt_tokens_total" in m:
        q = sum(v for _, v in m["sglang:prompt_tokens_total"])
        return q, q * sum(v for _, v in m.get("sglang:cache_hit_rate", []))
    q = sum(v for _, v in m.get("vllm:prefix_cache_queries_total", []))
    h = sum(v for _, v in m.get("vllm:prefix_cache_hits_total", []))
    return q, h


async def _engine_held(replay_port: int, flavour: Flavour) -> set[object]:
    """The blocks the engine holds per its own event stream (replayed from 0)."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{replay_port}")
    held: set[object] = set()
    try:
        await sock.send_multipart([b"", seq_bytes(0)])
        while True:
            frames = await wait_for_frames(sock)
            if frames[-2] == END_SEQ:
                return held
            for ev in decode_batch(flavour, frames[-1]).events:
                if isinstance(ev, BlockStored):
                    held.update(ev.block_hashes)
                elif isinstance(ev, BlockRemoved):
                    held.difference_update(ev.block_hashes)
                elif isinstance(ev, AllBlocksCleared):
                    held.clear()
    finally:
        sock.close(0)
        ctx.term()


async def wait_for_frames(sock: zmq.asyncio.Socket) -> list[bytes]:
    import asyncio

    return list(await asyncio.wait_for(sock.recv_multipart(), 10))  # a deadline, not a pause


@pytest.mark.parametrize("flavour", [Flavour.VLLM, Flavour.SGLANG])
async def test_kv_events_route_a_repeated_prefix_to_its_holder_and_follow_eviction_and_restart(
    tmp_path: Path, flavour: Flavour
) -> None:
    cfg = tmp_path / "fleet.yaml"
    # fault tolerance on: a killed engine is relaunched in place (same ports), as in tests/chaos
    cfg.write_text("nodemanager:\n  engine:\n    extra_args: [--sim-zero-latency, --sim-num-kv-blocks, '64']\n"
                   "controller:\n  fault_tolerance_config: {enable_fault_tolerance: true}\n")
    async with motor_up(tmp_path, "--kv-events", "--engine", flavour.value, "--prefill", "2", "--decode", "1",
                        "--config", str(cfg), timeout=150) as up:  # fmt: skip
        f = KvFleet(up, flavour)
        eps = await f.prefill_endpoints()
        assert len(eps) == 2
        # the nodemanagers planned and announced both ports; the controller carried them
        assert all(ep.kv_events_port and ep.kv_events_replay_port for ep in eps.values()), eps
        await wait_for(lambda: _has_keys(f, set(eps)), timeout=30, what="coordinator follows both prefill engines")

        # 1. the first request places the prefix on one engine; the index sees it there
        await f.chat("question zero")
        holder = await wait_for(lambda: _holder(f, eps), timeout=20, what="one prefill engine holds the prefix")
        other = next(k for k in eps if k != holder)
        h_port, o_port = eps[holder].business_port, eps[other].business_port
        truth = await _engine_held(eps[holder].kv_events_replay_port, flavour)
        await wait_for(lambda: _blocks(f, holder, len(truth)), timeout=20, what="index holds the prefix blocks")
        _, h0 = await _engine_counters(h_port)
        oq0, _ = await _engine_counters(o_port)
        d0 = await f.decisions()
        for i in range(5):
            await f.chat(f"question {i + 1}")
        q1, h1 = await _engine_counters(h_port)
        oq1, _ = await _engine_counters(o_port)
        assert oq1 == oq0, "the engine without the prefix got one of its requests"
        assert h1 - h0 >= 5 * 5 * 16, (h0, h1)  # every repeat hit the cached system prompt (>= 5 blocks)
        d1 = await f.decisions()
        assert d1["prefix"] - d0.get("prefix", 0) == 5

        # 2. eviction: unique prompts until the holder has cycled its 64 blocks twice
        n = 0
        while (await _engine_counters(h_port))[0] - q1 < 2 * 64 * 16:
            assert n < 300, "the flood never reached the holder"
            await f.chat(f"unique {n} " + " ".join(f"w{n}x{j}" for j in range(100)), system=f"other {n}")
            n += 1
        assert await _holder(f, eps) is None  # the engines' own streams: nobody holds it any more
        for key, ep in eps.items():  # the index equals what each engine's own stream says it holds
            count = len(await _engine_held(ep.kv_events_replay_port, flavour))
            await wait_for(lambda k=key, n=count: _blocks(f, k, n), timeout=20, what=f"index follows {key}")
        d2 = await f.decisions()
        await f.chat("question after eviction")
        d3 = await f.decisions()
        assert d3.get("cold", 0) - d2.get("cold", 0) == 1  # nobody holds it: the ring decides

        # 3. restart: kill the engine that holds it now; the nodemanager relaunches it on its ports
        holder2 = await wait_for(lambda: _holder(f, eps), timeout=20, what="the new holder")
        port2 = eps[holder2].business_port
        old_pid = f.engine_pid(port2)
        os.kill(old_pid, signal.SIGKILL)
        await wait_for(lambda: _relaunched(f, port2, old_pid), timeout=90, what="engine relaunched")
        await wait_for(lambda: _blocks(f, holder2, 0), timeout=60, what="index reset after the restart")
        await wait_for(lambda: _serves(f), timeout=60, what="fleet serves again")
        assert await _holder(f, eps) is None
        d4 = await f.decisions()
        await f.chat("question after restart")
        d5 = await f.decisions()
        assert d5.get("cold", 0) - d4.get("cold", 0) == 1


async def _has_keys(f: KvFleet, keys: set[str]) -> bool:
    return keys <= set(await f.index())


async def _holder(f: KvFleet, eps: dict[str, Any]) -> str | None:
    """The one prefill engine whose own event stream says it holds the system prompt's first block."""
    holders = [k for k, ep in eps.items()
               if FIRST_BLOCK[f.flavour] in await _engine_held(ep.kv_events_replay_port, f.flavour)]
    assert len(holders) <= 1, holders
    return holders[0] if holders else None


async def _blocks(f: KvFleet, engine: str, n: int) -> bool:
    return (await f.index()).get(engine, (-1.0, 1.0))[0] == n


def _relaunched(f: KvFleet, port: int, old_pid: int) -> bool:
    try:
        return f.engine_pid(port) != old_pid
    except AssertionError:
        return False


async def _serves(f: KvFleet) -> bool:
    try:
        await f.chat("are you back", system="a different system prompt")
    except openai.APIError:
        return False
    return True
