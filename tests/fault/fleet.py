"""A real local fleet for fault-tolerance tests: motor-controller + motor-coordinator + motor-gateway +
motor-nodemanagers launching motor-sim vLLM engines, and a tiny supervisor that restarts a
nodemanager which exits with ``EXIT_RESCHEDULE`` (75) — what ``motor up`` (or a kubelet) does."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as cgrpc
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as kpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as kgrpc
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as ngrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.runner import EXIT_RESCHEDULE
from tests.helpers import free_port
from tests.procs import (
    NodeManagerProc,
    Proc,
    start_controller,
    start_coordinator,
    start_gateway,
    start_nodemanager,
)

KEY = "fault-fleet-key"


def controller_config(coordinator: str, **ft: Any) -> dict[str, Any]:
    return {
        "coordinators": [coordinator],
        "heartbeat_interval_sec": 0.2,
        "heartbeat_timeout_sec": 1.0,
        "reconcile_interval_sec": 0.2,
        "sync_interval_sec": 2.0,
        "set_retry_interval_sec": 0.5,
        "rpc_timeout_sec": 2.0,
        "start_retry_interval_sec": 1.0,
        "fault_tolerance_config": {
            "enable_fault_tolerance": True,
            "engine_relaunch_complete_timeout_sec": 15.0,
            "engine_relaunch_poll_interval_sec": 0.2,
            "engine_relaunch_dispatch_retries": 2,
            **ft,
        },
        "node_restart": {"backend": "local", "wait_timeout_sec": 10.0},
    }


def nm_config(controller: str, key_file: str, log_dir: Path, job: str, role: str, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "job_name": job,
        "role": role,
        "engine_type": "vllm",
        "model_name": "sim-model",
        "ip": "127.0.0.1",
        "controller_address": controller,
        "server": {"host": "127.0.0.1", "port": 0, "management_key_file": key_file, "grace_seconds": 0.2},
        "endpoints_per_node": 1,
        "heartbeat_interval_seconds": 0.2,
        "daemon_loop_interval": 0.3,
        "config_watch_interval_sec": 0.2,
        "stop_exit_delay_sec": 0.1,
        "health": {"poll_interval_sec": 0.1, "timeout_sec": 0.5, "port_wait_sec": 10,
                   "startup_grace_sec": 0.0, "abnormal_threshold": 3},
        "engine": {"launcher": "simulator", "env": {"MOTOR_SIM_ZERO_LATENCY": "1"},
                   "stop_timeout_sec": 2.0, "log_dir": str(log_dir / f"engines-{job}")},
        "registration": {"max_attempts": 5, "backoff_base_sec": 0.2, "rpc_timeout_sec": 1.0},
        "fault_tolerance_config": {"enable_fault_tolerance": True, "report_retry_interval_sec": 0.2,
                                   "report_timeout_sec": 1.0},
        "log": {"format": "text", "level": "INFO"},
    }  # fmt: skip
    for k, v in over.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return cfg


@dataclass
class Node:
    name: str
    config: dict[str, Any]
    proc: NodeManagerProc
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)
    # Restart after any exit (not only 75) after this delay, like a pod rescheduled after a node loss.
    restart_any_exit_after: float | None = None
    _down_since: float | None = None


@dataclass
class Fleet:
    log_dir: Path
    key_file: str
    controller: Proc
    coordinator: Proc
    gateway: Proc
    nodes: dict[str, Node] = field(default_factory=dict)
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = open_channel(address)
        return self._channels[address]

    @property
    def md(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(KEY)

    async def add_node(
        self, name: str, job: str, role: str, *, restart_any_exit_after: float | None = None, **over: Any
    ) -> Node:
        cfg = nm_config(self.controller.address, self.key_file, self.log_dir, job, role, **over)
        proc = await start_nodemanager(self.log_dir, cfg, name=name)
        node = Node(name, cfg, proc, restart_any_exit_after=restart_any_exit_after)
        self.nodes[name] = node
        return node

    async def supervise(self) -> None:
        """Restart a nodemanager that exits with 75 (like ``motor up`` / a kubelet), or after any exit
        once ``restart_any_exit_after`` passed (a lost pod rescheduled)."""
        while True:
            for node in self.nodes.values():
                rc = node.proc.proc.poll()
                if rc is None:
                    continue
                if node._down_since is None:
                    node._down_since = time.monotonic()
                    node.exit_codes.append(rc)
                if rc != EXIT_RESCHEDULE:
                    wait = node.restart_any_exit_after
                    if wait is None or time.monotonic() - node._down_since < wait:
                        continue
                node._down_since = None
                (self.log_dir / f"{node.name}.ports.json").unlink(missing_ok=True)
                node.proc = await start_nodemanager(self.log_dir, node.config, name=node.name)
                node.restarts += 1
            await asyncio.sleep(0.1)

    # --- views ---------------------------------------------------------------------------------
    async def instances(self) -> list[cpb.ManagedInstance]:
        stub = cgrpc.ControllerAdminServiceStub(self.channel(self.controller.address))
        resp = await stub.ListInstances(cpb.ListInstancesRequest(), metadata=self.md, timeout=2)
        return list(resp.instances)

    async def live_instance(self, job: str) -> cpb.ManagedInstance | None:
        live = [m for m in await self.instances() if m.instance.job_name == job and m.state != cpb.INSTANCE_STATE_DELETED]
        return live[-1] if live else None

    async def active(self, *jobs: str) -> bool:
        for job in jobs:
            mi = await self.live_instance(job)
            if mi is None or mi.state != cpb.INSTANCE_STATE_ACTIVE:
                return False
        return True

    async def ft_status(self, instance_id: int) -> cpb.GetFaultToleranceStatusResponse:
        stub = cgrpc.ControllerAdminServiceStub(self.channel(self.controller.address))
        return await stub.GetFaultToleranceStatus(
            cpb.GetFaultToleranceStatusRequest(instance_id=instance_id), metadata=self.md, timeout=2
        )

    async def nm_status(self, name: str) -> npb.GetStatusResponse:
        stub = ngrpc.NodeManagerServiceStub(self.channel(self.nodes[name].proc.address))
        return await stub.GetStatus(npb.GetStatusRequest(), metadata=self.md, timeout=2)

    async def coordinator_view(self) -> dict[int, int]:
        """instance id -> coordinator status enum."""
        stub = kgrpc.InstanceRegistryServiceStub(self.channel(self.coordinator.address))
        resp = await stub.ListInstances(kpb.ListInstancesRequest(page_size=1000), metadata=self.md, timeout=2)
        return {i.id: i.status for i in resp.instances}

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        for node in self.nodes.values():
            await asyncio.to_thread(node.proc.terminate)


@asynccontextmanager
async def fleet(log_dir: Path, *, coordinator_config: dict[str, Any] | None = None,
                controller_extra: dict[str, Any] | None = None, **ft: Any) -> AsyncIterator[Fleet]:
    """With *coordinator_config*, the coordinator also gets ``controller_address`` (the controller's
    port is chosen first) so it can report alarms. *ft* goes into the controller's
    ``fault_tolerance_config``, *controller_extra* to the top level of its config."""
    log_dir.mkdir(parents=True, exist_ok=True)
    key_file = log_dir / "fleet.key"
    key_file.write_text(KEY + "\n")
    controller_port = free_port()
    ccfg = None
    if coordinator_config is not None:
        ccfg = {**coordinator_config, "controller_address": f"127.0.0.1:{controller_port}"}
    async with AsyncExitStack() as es:
        coordinator = await es.enter_async_context(start_coordinator(log_dir, ccfg, management_key=KEY))
        ctl_cfg = {**controller_config(coordinator.address, **ft), **(controller_extra or {})}
        if coordinator_config is not None:
            ctl_cfg["server"] = {"host": "127.0.0.1", "port": controller_port}
        controller = await es.enter_async_context(start_controller(log_dir, ctl_cfg, management_key=KEY))
        gateway = await es.enter_async_context(start_gateway(log_dir, [coordinator.address]))
        f = Fleet(log_dir, str(key_file), controller, coordinator, gateway)
        sup = asyncio.get_running_loop().create_task(f.supervise())
        try:
            yield f
        finally:
            sup.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sup
            await f.close()


@dataclass
class Load:
    """Steady request load through the gateway with the openai SDK; records (time, ok)."""

    base_url: str
    workers: int = 3
    results: list[tuple[float, bool]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def run(self) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=5.0)

        async def worker(i: int) -> None:
            n = 0
            while True:
                n += 1
                try:
                    r = await client.completions.create(model="sim-model", prompt=f"hello {i} {n}", max_tokens=4)
                    self.results.append((time.monotonic(), bool(r.choices)))
                except Exception as exc:
                    self.results.append((time.monotonic(), False))
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    await asyncio.sleep(0.05)

        try:
            await asyncio.gather(*(worker(i) for i in range(self.workers)))
        finally:
            await client.close()

    def first_ok_after(self, t: float) -> float | None:
        return next((ts for ts, ok in self.results if ts > t and ok), None)

    def failures_after(self, t: float) -> int:
        return sum(1 for ts, ok in self.results if ts > t and not ok)
