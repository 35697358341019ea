"""motor-sim publishes KV-cache events like the engine it plays (``--kv-events-config``): real
processes, a pyzmq SUB on the PUB socket and a DEALER on the replay socket, payloads decoded both
with plain msgpack (the engine's shape) and with Motor's decoder."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio

from motor_common.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    Flavour,
    decode_batch,
    parse_seq,
    seq_bytes,
    sglang_block_hashes,
    vllm_event_hashes,
)
from tests.helpers import free_port, wait_for

from .conftest import MOTOR_SIM, SimFactory, SimProc

TIMEOUT = aiohttp.ClientTimeout(total=10)
A = list(range(1, 13))  # 3 full blocks of 4
B = [*A[:8], 100, 101, 102, 103]  # shares A's first 2 blocks
C = list(range(200, 228))  # 7 full blocks: needs every block, evicts A's and B's


async def complete(sim: SimProc, prompt: list[int], path: str = "/v1/completions") -> None:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.post(sim.url + path, json=body) as r:
        assert r.status == 200, await r.text()


async def replay(ctx: zmq.asyncio.Context, endpoint: str, start: int, topic: bool) -> list[tuple[int, bytes]]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        await sock.send_multipart([b"", seq_bytes(start)])
        out: list[tuple[int, bytes]] = []
        while True:
            frames = await asyncio.wait_for(sock.recv_multipart(), 5)
            assert frames[0] == b""
            if topic:
                _, tp, seq, payload = frames
                assert tp in (b"kv-events", b"")
            else:
                _, seq, payload = frames
            if seq == END_SEQ:
                assert payload == b""
                return out
            out.append((parse_seq(seq), payload))
    finally:
        sock.close(0)


def events(batches: list[tuple[int, bytes]], flavour: Flavour) -> list[Any]:
    return [e for _, p in batches for e in decode_batch(flavour, p).events]


@pytest.mark.slow
async def test_vllm_sim_publishes_vllm_events_with_evictions_and_replay(sims: SimFactory) -> None:
    pub, rep = free_port(), free_port()
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",
           "replay_endpoint": f"tcp://*:{rep}", "topic": "kv-events"}
    sim = sims.vllm("--kv-events-config", json.dumps(cfg), "--block-size", "4",
                    "--sim-num-kv-blocks", "8", "--sim-zero-latency")
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    sub.connect(f"tcp://127.0.0.1:{pub}")
    try:
        await complete(sim, A)
        await complete(sim, B)
        await complete(sim, C)
        batches = await wait_for(
            lambda: _at_least(replay(ctx, f"tcp://127.0.0.1:{rep}", 0, topic=True), 3),
            what="three batches in the replay buffer")
        assert [s for s, _ in batches] == list(range(len(batches)))  # from 0, no gap
        raw = msgspec.msgpack.decode(batches[0][1])  # the engine's own shape
        assert isinstance(raw, list) and len(raw) == 3 and raw[2] == 0
        assert raw[1][0]["type"] == "BlockStored" and raw[1][0]["block_size"] == 4
        assert raw[1][0]["medium"] == "GPU" and raw[1][0]["group_idx"] == 0

        ha, hb, hc = (vllm_event_hashes(p, 4) for p in (A, B, C))
        evs = events(batches, Flavour.VLLM)
        stored = [e for e in evs if isinstance(e, BlockStored)]
        assert stored[0] == BlockStored(tuple(ha), None, tuple(A), 4)
        assert stored[1] == BlockStored((hb[2],), hb[1], tuple(B[8:]), 4)  # only the new block
        assert stored[2].block_hashes == tuple(hc) and stored[2].parent_block_hash is None
        removed = {h for e in evs if isinstance(e, BlockRemoved) for h in e.block_hashes}
        assert removed == set(ha) | {hb[2]}  # C needed every block: all cached blocks evicted

        # a replay from the middle starts there; the live stream carried the same payloads
        assert await replay(ctx, f"tcp://127.0.0.1:{rep}", 1, topic=True) == batches[1:]
        live: dict[int, bytes] = {}

        async def drain_past(seq: int) -> bool:
            while await sub.poll(0):
                topic, s, payload = await sub.recv_multipart()
                assert topic == b"kv-events"
                live[parse_seq(s)] = payload
            return bool(live) and max(live) > seq

        # the SUB may have joined after the first batches (ZMQ slow joiner): that is what replay
        # is for; a batch published now reaches it live (an earlier one may have too: the SUB may
        # have joined in time for it, so wait for one newer than the replayed ones)
        await complete(sim, A)
        last = batches[-1][0]
        await wait_for(lambda: drain_past(last), what="a new batch on the live stream")
        everything = dict(await replay(ctx, f"tcp://127.0.0.1:{rep}", 0, topic=True))
        # the completion may have been published as more than one batch: the live stream catches up
        await wait_for(lambda: drain_past(max(everything) - 1), what="the live stream up to the replay's newest")
        assert max(live) == max(everything) > last
        assert all(everything[s] == p for s, p in live.items())
    finally:
        sub.close(0)
        ctx.term()


async def _at_least(coro: Any, n: int) -> list[tuple[int, bytes]] | None:
    got: list[tuple[int, bytes]] = await coro
    return got if len(got) >= n else None


@pytest.mark.slow
async def test_sglang_sim_publishes_per_page_events_and_replays_without_topic(sims: SimFactory) -> None:
    pub, rep = free_port(), free_port()
    cfg = {"publisher": "zmq", "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{rep}"}
    sim = sims.sglang("--kv-events-config", json.dumps(cfg), "--page-size", "4",
                      "--sim-num-kv-blocks", "8", "--sim-zero-latency")
    ctx = zmq.asyncio.Context()
    try:
        await complete(sim, A)
        batches = await wait_for(
            lambda: _at_least(replay(ctx, f"tcp://127.0.0.1:{rep}", 0, topic=False), 1),
            what="a batch in the replay buffer")
        raw = msgspec.msgpack.decode(batches[0][1])
        assert len(raw) == 2  # [ts, events]: no dp rank
        ha = sglang_block_hashes(A, 4)
        assert raw[1] == [
            ["BlockStored", [ha[0]], None, A[0:4], 4, None],
            ["BlockStored", [ha[1]], ha[0], A[4:8], 4, None],
            ["BlockStored", [ha[2]], ha[1], A[8:12], 4, None],
        ]
    finally:
        ctx.term()


def test_bad_kv_events_config_is_a_usage_error() -> None:
    for flavour_args, cfg, needle in [
        (["vllm", "serve", "m"], {"enable_kv_cache_events": True, "endpoint": "nope"}, "endpoint"),
        (["vllm", "serve", "m"], {"enable_kv_cache_events": True, "bogus": 1}, "bogus"),
        (["sglang", "--model-path", "m"], {"publisher": "kafka"}, "publisher"),
        (["sglang", "--model-path", "m"], {"publisher": "zmq", "buffer_steps": 0}, "buffer_steps"),
    ]:
        r = subprocess.run([MOTOR_SIM, *flavour_args, "--kv-events-config", json.dumps(cfg)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, r.stderr
        assert "--kv-events-config" in r.stderr and needle in r.stderr


def test_events_off_by_default_and_unchanged_hashing() -> None:
    from motor_sim.kvcache import BlockManager

    bm = BlockManager(8, 4)
    bm.allocate("a", A, 13)
    assert bm.take_events() == []  # no hasher: nothing queued, the cheap hash stays
    bm2 = BlockManager(8, 4, hasher=lambda ids, bs: list(vllm_event_hashes(ids, bs)))
    bm2.allocate("a", A, 13)
    bm2.free("a")
    assert bm2.reset()
    assert bm2.take_events() == [BlockStored(tuple(vllm_event_hashes(A, 4)), None, tuple(A), 4),
                                 AllBlocksCleared()]
    assert EventBatch  # re-exported type used by the publisher
