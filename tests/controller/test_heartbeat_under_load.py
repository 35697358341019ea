"""No instance flap from load alone: a real `motor-controller` with the default 1 s heartbeats and
3 s timeout, fake nodemanagers heartbeating over the real stream.

* the controller process is frozen (SIGSTOP) for 4 s — longer than the timeout — as a starved
  process would be; its nodes' frames wait in its sockets. Resumed, it must not declare them lost;
* a bounded run under extra CPU load (two busy-loop processes on top of whatever the box runs):
  no transition out of ACTIVE.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.grpc_client import call_metadata, open_channel
from tests.controller.fakes import KEY, FakeNodeManager
from tests.helpers import wait_for
from tests.procs import start_controller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CONFIG = {"heartbeat_interval_sec": 1.0, "heartbeat_timeout_sec": 3.0, "reconcile_interval_sec": 0.5}


async def states(address: str) -> list[int]:
    async with open_channel(address) as ch:
        resp = await pbgrpc.ControllerAdminServiceStub(ch).ListInstances(
            pb.ListInstancesRequest(), metadata=call_metadata(KEY), timeout=5)
    return [i.state for i in resp.instances]


def flaps(log: str) -> int:
    return log.count("from=active to=inactive") + log.count('"from": "active", "to": "inactive"')


async def active_fleet(address: str) -> list[FakeNodeManager]:
    nms = [await FakeNodeManager(f"job-{j}-n0", f"job-{j}", 0, 1, address, interval=1.0).start() for j in "ab"]

    async def all_active() -> bool:
        return await states(address) == [pb.INSTANCE_STATE_ACTIVE] * 2

    await wait_for(all_active, timeout=30, what="2 instances ACTIVE")
    return nms


async def test_a_controller_frozen_longer_than_the_timeout_does_not_flap_its_nodes(tmp_path: Path) -> None:
    async with start_controller(tmp_path, CONFIG, management_key=KEY) as ctl:
        nms = await active_fleet(ctl.address)
        try:
            os.kill(ctl.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            await wait_for(lambda: time.monotonic() - frozen > 4.0, timeout=10, what="4 s frozen")
            os.kill(ctl.pid, signal.SIGCONT)
            # the nodes keep beating; several reconcile rounds later nothing has moved
            seen = [n.registrations for n in nms]
            resumed = time.monotonic()
            await wait_for(lambda: time.monotonic() - resumed > 3.0, timeout=10, what="3 s after resume")
            assert await states(ctl.address) == [pb.INSTANCE_STATE_ACTIVE] * 2
            assert flaps(ctl.log()) == 0, ctl.log()[-3000:]
            assert [n.registrations for n in nms] == seen
            assert "event loop stalled" in ctl.log()
        finally:
            for n in nms:
                await n.close()


async def test_no_flap_under_cpu_load(tmp_path: Path) -> None:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        async with start_controller(tmp_path, CONFIG, management_key=KEY) as ctl:
            nms = await active_fleet(ctl.address)
            try:
                start = time.monotonic()
                samples = 0

                async def watched() -> bool:
                    nonlocal samples
                    assert await states(ctl.address) == [pb.INSTANCE_STATE_ACTIVE] * 2
                    samples += 1
                    return time.monotonic() - start > 20.0

                await wait_for(watched, timeout=40, what="20 s under load")
                assert flaps(ctl.log()) == 0, ctl.log()[-3000:]
                assert samples > 5
            finally:
                for n in nms:
                    await n.close()
    finally:
        for b in burners:
            b.kill()
            b.wait()


async def test_a_stalled_receiving_loop_does_not_age_heartbeats(caplog: pytest.LogCaptureFixture, tmp_path: Path
                                                               ) -> None:
    """The controller's event loop is blocked for 4 s (a starved process, a long synchronous step):
    when it runs again its reconcile timer is due before the nodes' next frames are read."""
    from tests.controller.fakes import controller_config, start_controller_inproc

    cfg = controller_config(tmp_path, heartbeat_interval_sec=1.0, heartbeat_timeout_sec=3.0,
                            reconcile_interval_sec=0.5)
    ctl = await start_controller_inproc(cfg)
    caplog.set_level(logging.INFO, logger="motor_controller")
    try:
        nms = await active_fleet(ctl.address)
        try:
            mark = len(caplog.records)
            time.sleep(4.0)  # deliberately blocks the event loop: the fault under test
            resumed = time.monotonic()
            await wait_for(lambda: time.monotonic() - resumed > 3.0, timeout=10, what="3 s after the stall")
            moved = [r for r in caplog.records[mark:] if r.getMessage() == "instance state" and getattr(r, "to", "") != "active"]
            assert moved == [], [(getattr(r, "instance_id", None), getattr(r, "reason", None)) for r in moved]
            assert await states(ctl.address) == [pb.INSTANCE_STATE_ACTIVE] * 2
        finally:
            for n in nms:
                await n.close()
    finally:
        await ctl.stop()
