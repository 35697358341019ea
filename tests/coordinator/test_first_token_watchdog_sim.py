"""A decode that sends a stream's head and then freezes — a real vLLM sends a stream's headers at
once, before its first token, so the first-byte watchdog has seen it answer — is caught before the
first token under the same ``first_byte_timeout_sec`` of no sign of life: the request goes to
another decode, or (none left) is computed whole by its prefill, instead of waiting for ever.

Real ``motor-sim`` engines (``freeze_after_head``: the event loop blocks right after the head,
probes go unanswered), an in-process coordinator through its real gRPC API."""

from __future__ import annotations

import json
import logging
import urllib.request
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from motor_common.domain import EngineType, Role
from tests.coordinator.test_decode_retry_sim import coordinator
from tests.coordinator.test_dispatch_sim import CHAT, MODEL, dispatch, instance, text_of
from tests.procs import start_simulator

pytestmark = pytest.mark.slow

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "frozen after the head"}], "max_tokens": 5,
        "stream": True}


def freeze_after_head(url: str) -> None:
    req = urllib.request.Request(url + "/sim/fault", data=json.dumps({"mode": "freeze_after_head"}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")  # fmt: skip
    urllib.request.urlopen(req, timeout=5).read()


@pytest.mark.parametrize("other_decode", [True, False], ids=["another-decode", "prefill-alone"])
async def test_a_decode_frozen_after_its_head_is_left_before_the_first_token(
        tmp_path: Path, other_decode: bool, caplog: pytest.LogCaptureFixture) -> None:
    async with AsyncExitStack() as st:
        p = await st.enter_async_context(start_simulator("vllm", "prefill", tmp_path, name="p"))
        frozen = await st.enter_async_context(start_simulator("vllm", "decode", tmp_path, name="d1"))
        good = await st.enter_async_context(start_simulator("vllm", "decode", tmp_path, name="d2"))
        app, s = await st.enter_async_context(coordinator(
            first_byte_timeout_sec=2.0, health_probe_interval_sec=0.2, probe_timeout_sec=0.3))
        decodes = [instance(2, Role.DECODE, EngineType.VLLM, [frozen])]
        if other_decode:
            decodes.append(instance(3, Role.DECODE, EngineType.VLLM, [good]))
        await s.set(instance(1, Role.PREFILL, EngineType.VLLM, [p]), *decodes)
        head, raw = await dispatch(s, CHAT, BODY, timeout=30)  # a healthy pair first (round robin: d1)
        freeze_after_head(frozen.url)
        caplog.set_level(logging.WARNING, "motor_coordinator.dispatcher")
        outcomes = [await dispatch(s, CHAT, {**BODY, "messages": [{"role": "user", "content": f"q{i}"}]},
                                   timeout=30) for i in range(2)]  # fmt: skip
        for head, raw in outcomes:
            assert head.http_status == 200, raw[:300]
            text, finish, _ = text_of(CHAT, raw, True)
            assert text and finish == "length", raw[:300]
            assert head.decode_instance_id != 2
        # it reached the frozen decode (not kept away by failed probes alone) and left it there
        assert "sent its head, then no token and no sign of life for 2s" in caplog.text
        # the frozen decode is out of rotation (tripped): the next request does not wait on it
        assert app.scheduler.is_broken(app.scheduler.state.instances[2].endpoints[0])
