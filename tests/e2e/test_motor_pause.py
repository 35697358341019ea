"""`motor pause` / `motor resume` in a managed fleet (real processes, `motor up`): the pause is the
controller's (ControllerAdminService/PauseInstance, kept in its store). The paused decode instance
turns PAUSED at the coordinator and gets no new request while the other serves them all; the pause
survives a kill -9 of the controller and then of the coordinator (which gets it back in the
restarted controller's full SET); resume brings it back. The coordinator itself refuses an
operator's untracked PauseInstances because it is managed (FAILED_PRECONDITION)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import aiohttp
import grpc
import openai
import psutil
import pytest

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbg
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import error_reason
from tests.conftest import tool
from tests.helpers import wait_for
from tests.motor_up import UpFleet, motor_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REQUESTS = 6


def key(fleet: UpFleet) -> str:
    return Path(fleet.info["management_key_file"]).read_text().strip()


async def listed(fleet: UpFleet) -> list[cpb.InstanceSummary | tpb.Instance]:
    async with open_channel(fleet.info["coordinators"][0]) as ch:
        resp = await cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
            cpb.ListInstancesRequest(), metadata=call_metadata(key(fleet)), timeout=5)
    return list(resp.instances)


async def statuses(fleet: UpFleet) -> dict[int, str]:
    return {i.id: tpb.InstanceStatus.Name(i.status) for i in await listed(fleet)}


async def managed(fleet: UpFleet, iid: int) -> pb.ManagedInstance:
    async with open_channel(fleet.info["controller"]) as ch:
        resp = await pbg.ControllerAdminServiceStub(ch).GetInstance(
            pb.GetInstanceRequest(instance_id=iid), metadata=call_metadata(key(fleet)), timeout=5)
    return resp.instance


async def motor(fleet: UpFleet, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [tool("motor"), *args, "--state-dir", str(fleet.state)],
        capture_output=True, text=True, timeout=30)


async def served(url: str) -> float:
    """Requests an engine finished (its own vllm:request_success counter)."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


async def kill_and_wait_restart(fleet: UpFleet, program: str, what_loaded: str) -> None:
    """SIGKILL *program*; wait until `motor up` restarted it and its log says *what_loaded* (logged
    once it serves on its port) once more."""
    log = Path(fleet.info["programs"][program]["log"])
    before = log.read_text(errors="replace").count(what_loaded)
    old = fleet.info["programs"][program]["pid"]
    os.kill(old, signal.SIGKILL)

    def back() -> bool:
        pid = fleet.info["programs"][program]["pid"]
        return (bool(pid) and pid != old and psutil.pid_exists(pid)
                and log.read_text(errors="replace").count(what_loaded) > before)

    await wait_for(back, timeout=60, what=f"{program} restarted by motor up")


async def test_pause_is_kept_by_the_controller_across_restarts_and_paused_instances_get_no_requests(
    tmp_path: Path,
) -> None:
    async with motor_up(tmp_path, "--prefill", "1", "--decode", "2", "--zero-latency",
                        "--restart-delay", "1") as fleet:
        decodes = sorted(i.id for i in await listed(fleet) if i.role == tpb.ROLE_DECODE)
        assert len(decodes) == 2
        paused_id, other_id = decodes
        urls = {i.id: f"http://{i.endpoints[0].ip}:{i.endpoints[0].business_port}" for i in await listed(fleet)}

        out = await motor(fleet, "pause", str(paused_id), "--reason", "bad GPU, draining", "--json")
        assert out.returncode == 0, out.stderr
        body = json.loads(out.stdout)
        assert (body["state"], body["paused"], body["reason"]) == ("paused", True, "bad GPU, draining")

        async def status_of(iid: int) -> str | None:
            return (await statuses(fleet)).get(iid)

        async def is_paused() -> bool:
            return await status_of(paused_id) == "INSTANCE_STATUS_PAUSED"

        await wait_for(is_paused, timeout=20, what="instance paused at the coordinator")
        assert await status_of(other_id) == "INSTANCE_STATUS_AVAILABLE"

        # no new request reaches the paused instance; the other serves them all
        before = {iid: await served(urls[iid]) for iid in decodes}
        client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="x", max_retries=0, timeout=30)
        try:
            for n in range(REQUESTS):
                resp = await client.completions.create(model="tiny", prompt=f"p{n}", max_tokens=3)
                assert resp.choices[0].text
        finally:
            await client.close()
        after = {iid: await served(urls[iid]) for iid in decodes}
        assert after[paused_id] == before[paused_id]
        assert after[other_id] == before[other_id] + REQUESTS

        # The coordinator is managed: a direct untracked pause is refused and changes nothing.
        async with open_channel(fleet.info["coordinators"][0]) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await cgrpc.InstanceRegistryServiceStub(ch).PauseInstances(
                    cpb.PauseInstancesRequest(instance_ids=[other_id]), metadata=call_metadata(key(fleet)), timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_reason(err.value) == "MANAGED_BY_CONTROLLER" and "motor pause" in (err.value.details() or "")
        assert await status_of(other_id) == "INSTANCE_STATUS_AVAILABLE"

        # The pause is the controller's: it survives a kill -9 of the controller, then of the
        # coordinator (which comes back empty and gets it in the controller's full SET).
        samples: list[dict[int, str]] = []
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                try:
                    samples.append(await statuses(fleet))
                except grpc.aio.AioRpcError:
                    pass  # the coordinator is down
                await asyncio.sleep(0.1)  # sampling rate, not synchronisation

        sampler = asyncio.create_task(sample())
        try:
            await kill_and_wait_restart(fleet, "controller", "motor-controller ready")
            mi = await managed(fleet, paused_id)
            assert (mi.paused, mi.pause_reason) == (True, "bad GPU, draining") and mi.HasField("paused_at")
            await kill_and_wait_restart(fleet, "coordinator", "coordinator started")

            async def back_paused() -> bool:
                return (await statuses(fleet)).get(paused_id) == "INSTANCE_STATUS_PAUSED"

            await wait_for(back_paused, timeout=30, what="restarted coordinator has the paused instance")
        finally:
            stop.set()
            await sampler
        seen = [s[paused_id] for s in samples if paused_id in s]
        assert seen and set(seen) == {"INSTANCE_STATUS_PAUSED"}, sorted(set(seen))

        status = await motor(fleet, "status", "--json")
        row = next(i for i in json.loads(status.stdout)["instances"] if i["id"] == paused_id)
        assert (row["paused"], row["pause_reason"]) == (True, "bad GPU, draining")

        resumed = await motor(fleet, "resume", str(paused_id))
        assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr

        async def available() -> bool:
            return await status_of(paused_id) == "INSTANCE_STATUS_AVAILABLE"

        await wait_for(available, timeout=20, what="instance resumed")
        assert not (await managed(fleet, paused_id)).paused

        # by node: the instance the node serves
        node = row["nodes"][0]
        by_node = await motor(fleet, "pause", "--node", node, "--json")
        assert by_node.returncode == 0 and json.loads(by_node.stdout)["instance_id"] == paused_id, by_node.stderr
        await wait_for(is_paused, timeout=20, what="instance paused by node at the coordinator")
        back = await motor(fleet, "resume", "--node", node)
        assert back.returncode == 0, back.stderr
        await wait_for(available, timeout=20, what="instance resumed by node")
        neither = await motor(fleet, "pause")
        assert neither.returncode == 2 and "--node" in neither.stderr

        unknown = await motor(fleet, "pause", "12345")
        assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
        too_big = await motor(fleet, "pause", str(2**53))
        assert too_big.returncode == 2 and "2^53-1" in too_big.stderr


async def test_motor_up_is_ready_with_the_pair_paired_and_says_when_one_side_serves_alone(tmp_path: Path) -> None:
    """`motor up` is ready only once the coordinator routes the prefill+decode pair (a coordinator
    with one side already serves, whole, on it: scheduler.*_only_fallback); with the decode paused
    its status line says the model is served by its prefills alone, requests still succeed, and the
    line clears when the decode is resumed."""
    async with motor_up(tmp_path, "--prefill", "1", "--decode", "1", "--zero-latency") as fleet:
        async with open_channel(fleet.info["coordinators"][0]) as ch:
            r = await cgrpc.DispatchServiceStub(ch).GetReadiness(cpb.GetReadinessRequest(), timeout=5)
        assert r.ready and r.available_instances == 2 and not r.served_alone, r
        [decode] = [i.id for i in await listed(fleet) if i.role == tpb.ROLE_DECODE]
        out = await motor(fleet, "pause", str(decode), "--reason", "test: decode away")
        assert out.returncode == 0, out.stderr

        def said(text: str) -> bool:
            return text in fleet.log.read_text(errors="replace")

        degraded = "DEGRADED, served alone: tiny (by its prefills alone)"
        await wait_for(lambda: said(degraded), timeout=20, what="motor up saying the prefills serve alone")
        status = await motor(fleet, "status")  # motor status asks the fleet's coordinators too
        assert status.returncode == 0 and degraded in status.stdout.splitlines()[0], status.stdout
        status = await motor(fleet, "status", "--json")
        assert json.loads(status.stdout)["served_alone"] == ["tiny (by its prefills alone)"], status.stdout
        client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="x", max_retries=0, timeout=30)
        try:
            resp = await client.completions.create(model="tiny", prompt="alone", max_tokens=3)
            assert resp.choices[0].text
        finally:
            await client.close()
        lines_before = fleet.log.read_text(errors="replace").count("\n")
        back = await motor(fleet, "resume", str(decode))
        assert back.returncode == 0, back.stderr

        def cleared() -> bool:
            new = fleet.log.read_text(errors="replace").splitlines()[lines_before:]
            return any("instances 2/2 active" in ln and "ready" in ln and degraded not in ln for ln in new)

        await wait_for(cleared, timeout=20, what="motor up's status line without the degraded note")
        status = await motor(fleet, "status", "--json")
        assert json.loads(status.stdout)["served_alone"] == [], status.stdout
