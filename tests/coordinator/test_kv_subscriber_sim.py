"""The coordinator's KV-event subscriber against real motor-sim processes publishing vLLM's
format: catch-up by replay, live updates, evictions, an engine restart, a source removed."""

from __future__ import annotations

import json

import aiohttp
import pytest

from motor_common.kv_events import Flavour, vllm_event_hashes
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.kv_subscriber import EventSource, KvEventSubscriber
from tests.helpers import free_port, wait_for
from tests.simulator.conftest import SimFactory, SimProc, sims, stop

__all__ = ["sims"]  # the simulator fixture, reused here

A = list(range(1, 13))
C = list(range(200, 228))
HA, HC = vllm_event_hashes(A, 4), vllm_event_hashes(C, 4)


async def complete(sim: SimProc, prompt: list[int]) -> None:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.post(sim.v1 + "/completions", json=body) as r:
        assert r.status == 200, await r.text()


def start_sim(sims: SimFactory, pub: int, rep: int, port: int | None = None) -> SimProc:
    cfg = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{pub}",
           "replay_endpoint": f"tcp://*:{rep}", "topic": "kv-events"}
    args = ["vllm", "serve", "sim-model", "--kv-events-config", json.dumps(cfg),
            "--block-size", "4", "--sim-num-kv-blocks", "8", "--sim-zero-latency"]
    return sims.start(*args, port=port)


@pytest.mark.slow
async def test_subscriber_follows_a_real_engine(sims: SimFactory) -> None:
    pub, rep = free_port(), free_port()
    sim = start_sim(sims, pub, rep)
    await complete(sim, A)  # published before anyone listens: only the replay has it
    index = KvIndex()
    sub = KvEventSubscriber(index)
    src = EventSource("e1", "sim-model", Flavour.VLLM, f"tcp://127.0.0.1:{pub}",
                      f"tcp://127.0.0.1:{rep}", "kv-events")
    try:
        sub.set_sources([src])
        await wait_for(lambda: index.prefix_lengths("sim-model", HA, ["e1"])["e1"] == 3,
                       what="A's blocks caught up by replay")
        assert sub.replays >= 1
        await complete(sim, C)  # evicts A's blocks (8 blocks in all)
        await wait_for(lambda: index.prefix_lengths("sim-model", HC, ["e1"])["e1"] == 7,
                       what="C's blocks, live")
        assert index.prefix_lengths("sim-model", HA, ["e1"]) == {"e1": 0}

        # the engine restarts on the same ports: its stream starts at 0 again, the index resets
        port = sim.port
        stop(sim)
        sim2 = start_sim(sims, pub, rep, port=port)
        await complete(sim2, A)
        await wait_for(lambda: index.prefix_lengths("sim-model", HA, ["e1"])["e1"] == 3,
                       what="A again after the restart")
        assert index.restarts("e1") == 1
        assert index.prefix_lengths("sim-model", HC, ["e1"]) == {"e1": 0}  # the old life's blocks

        sub.set_sources([])
        assert not index.has_engine("e1")
    finally:
        await sub.close()
