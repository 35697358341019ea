"""`motor up`: the whole managed fleet on one machine, driven like a newcomer would.

Real processes throughout: `motor up` starts coordinator, controller, nodemanagers (which launch
`motor-sim` engines) and gateway; requests go through the `openai` SDK; a nodemanager is killed and
comes back through `motor up`'s supervisor (the local stand-in for a kubelet).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import psutil
import pytest

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from tests.conftest import tool
from tests.helpers import wait_for
from tests.motor_up import UpFleet, motor_up

pytestmark = pytest.mark.slow


class Fleet(UpFleet):
    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.info["gateway_url"] + "/v1", api_key="unused", max_retries=0, timeout=10
        )

    async def coordinator_roles(self) -> list[str]:
        key = Path(self.info["management_key_file"]).read_text().strip()
        async with open_channel(self.info["coordinators"][0]) as ch:
            resp = await cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
                cpb.ListInstancesRequest(), metadata=call_metadata(key), timeout=5
            )
        return sorted(tpb.Role.Name(i.role) for i in resp.instances)


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with motor_up(
        tmp_path, "--prefill", "2", "--decode", "1", "--restart-delay", "6", "--zero-latency"
    ) as up:
        yield Fleet(up.state, up.proc, up.log)


async def test_motor_up_serves_requests_and_survives_a_lost_node(fleet: Fleet) -> None:
    client = fleet.client()
    card = await client.models.retrieve("tiny")  # GET /v1/models/{id}
    assert (card.id, card.object) == ("tiny", "model")
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"
    resp = await client.completions.create(model="tiny", prompt="Hello, Motor", max_tokens=8)
    assert resp.choices[0].text and resp.usage is not None and resp.usage.completion_tokens == 8
    chunks = [
        c
        async for c in await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True
        )
    ]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    # every engine writes its own log, named after its node (they once all shared engine-0.log)
    logs = fleet.state / "logs"
    engine_logs = sorted(p.name for p in logs.glob("*engine-*.log"))
    assert engine_logs == ["decode-0.engine-0.log", "prefill-0.engine-0.log", "prefill-1.engine-0.log"]
    for name in engine_logs:
        role = name.split("-", 1)[0]
        text = (logs / name).read_text(errors="replace")
        assert f"motor-sim vllm ({role}) serving" in text, (name, text[-500:])
        assert text.count("Application startup complete.") == 1, (name, text[-500:])

    status = subprocess.run(
        [tool("motor"), "status", "--state-dir", str(fleet.state), "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    view = json.loads(status.stdout)
    assert sorted(i["role"] for i in view["instances"] if i["state"] == "active") == [
        "decode",
        "prefill",
        "prefill",
    ]
    assert await fleet.coordinator_roles() == ["ROLE_DECODE", "ROLE_PREFILL", "ROLE_PREFILL"]

    # Kill one prefill nodemanager hard: its engine outlives it (engine.adopt_on_restart) and keeps
    # serving; the restarted nodemanager adopts it instead of launching a new one.
    victim = fleet.info["programs"]["prefill-0"]["pid"]
    engines = [c.pid for c in psutil.Process(victim).children(recursive=True)]
    assert engines, "the nodemanager should have an engine child"
    os.kill(victim, signal.SIGKILL)
    for _ in range(5):
        ok = await client.completions.create(model="tiny", prompt="still there?", max_tokens=4)
        assert ok.choices[0].finish_reason == "length"

    # The supervisor restarts the nodemanager; it re-registers and adopts its engine.
    async def restarted() -> bool:
        return bool(fleet.info["programs"]["prefill-0"]["starts"] == 2)

    async def both_prefills_back() -> bool:
        return await fleet.coordinator_roles() == ["ROLE_DECODE", "ROLE_PREFILL", "ROLE_PREFILL"]

    await wait_for(restarted, timeout=40, what="prefill-0 nodemanager restarted")
    await wait_for(both_prefills_back, timeout=40, what="prefill instance back")
    nm_logs = "".join(p.read_text(errors="replace") for p in fleet.state.rglob("*prefill-0*.log"))
    await wait_for(lambda: "engine adopted from the previous nodemanager" in "".join(
        p.read_text(errors="replace") for p in fleet.state.rglob("*.log")), timeout=30, what="engine adopted")
    assert all(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in engines), nm_logs[-2000:]
    for _ in range(5):
        ok = await client.completions.create(model="tiny", prompt="still there?", max_tokens=4)
        assert ok.choices[0].finish_reason == "length"

    # Ctrl-C equivalent: everything stops, nothing is left behind.
    pids = [p["pid"] for p in fleet.info["programs"].values() if p["pid"]]
    children = [
        c.pid
        for pid in pids
        if psutil.pid_exists(pid)
        for c in psutil.Process(pid).children(recursive=True)
    ]
    fleet.proc.send_signal(signal.SIGINT)
    assert fleet.proc.wait(40) == 0, fleet.log.read_text()[-2000:]
    await wait_for(
        lambda: (
            not any(
                psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                for p in pids + children + engines
            )
        ),
        timeout=10,
        what="no process left",
    )
    assert "Stopped; no process left running." in fleet.log.read_text()
