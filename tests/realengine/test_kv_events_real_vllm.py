"""The real vLLM CPU engine's KV-event stream against Motor's index: the block hashes Motor
predicts for a prompt (``vllm_block_hashes``: sha256, default seed, block size 32) are the ones the
engine reports, decoded by Motor's decoder, caught up through its replay socket and followed live.

Needs ``scripts/real-engine-setup``; skips only when the venv is absent.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import aiohttp

from motor_common.kv_events import Flavour, vllm_event_hashes
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.kv_subscriber import EventSource, KvEventSubscriber
from tests.helpers import free_port, wait_for
from tests.realengine.test_vllm_vs_simulator import (
    LIMITS,
    MODEL_DIR,
    NAME,
    REAL_VLLM,
    _spawn,
    _stop,
    _wait_healthy,
    lane,
)

pytestmark = lane(900)

BS = 32  # vLLM's CPU attention backend needs a multiple of 32 (16 fails at start-up)
FIRST = list(range(100, 180))  # 80 tokens: 2 full blocks
SECOND = [*FIRST[:BS], *range(300, 348)]  # shares FIRST's first block (the tiny model: 512 ids)


async def complete(url: str, prompt: list[int]) -> None:
    body = {"model": NAME, "prompt": prompt, "max_tokens": 1}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s, \
            s.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()


async def test_real_vllm_reports_the_block_hashes_motor_predicts() -> None:
    pub, rep = free_port(), free_port()
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",
           "replay_endpoint": f"tcp://*:{rep}", "topic": "kv-events"}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # the default seed
    with tempfile.TemporaryDirectory(prefix="realengine-kv-") as tmp:
        t0 = time.monotonic()
        real = _spawn("vllm", [str(REAL_VLLM), "serve", str(MODEL_DIR), "--served-model-name", NAME,
                               *LIMITS, "--block-size", str(BS), "--enable-prefix-caching",
                               "--kv-events-config", json.dumps(cfg)], Path(tmp), env)
        index = KvIndex()
        sub = KvEventSubscriber(index, replay_timeout_s=5.0)
        try:
            _wait_healthy(real, t0, 600)
            await complete(real.url, FIRST)  # before anyone listens: the replay has it
            sub.set_sources([EventSource("real", NAME, Flavour.VLLM, f"tcp://127.0.0.1:{pub}",
                                         f"tcp://127.0.0.1:{rep}", "kv-events")])
            hf = vllm_event_hashes(FIRST, BS)
            await wait_for(lambda: index.prefix_lengths(NAME, hf, ["real"])["real"] == 2,
                           timeout=30, what="FIRST's two blocks, as Motor hashes them")
            await complete(real.url, SECOND)  # live: one new block after the shared one
            hs = vllm_event_hashes(SECOND, BS)
            assert hs[0] == hf[0]
            await wait_for(lambda: index.prefix_lengths(NAME, hs, ["real"])["real"] == 2,
                           timeout=30, what="SECOND's blocks, live")
            assert not index.is_stale("real")
        finally:
            await sub.close()
            _stop(real)
