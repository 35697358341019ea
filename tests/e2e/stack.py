"""A standalone Motor stack of real processes: simulator engines, coordinator, gateway, CLI."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from tests.conftest import tool
from tests.helpers import free_port, kill_group, wait_for

MODEL = "tiny"


@dataclass
class Proc:
    name: str
    proc: asyncio.subprocess.Process
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def stop(self, timeout: float = 10.0) -> None:
        if self.proc.returncode is None:
            kill_group(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                kill_group(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        kill_group(self.proc.pid, signal.SIGKILL)  # stragglers of the group


async def spawn(name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> Proc:
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=out, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return Proc(name, proc, log_path)


async def read_ports(p: Proc, path: Path, timeout: float = 30.0) -> dict[str, int]:
    def ready() -> dict[str, int] | None:
        if p.proc.returncode is not None:
            raise AssertionError(f"{p.name} exited with {p.proc.returncode}:\n{p.log()}")
        return orjson.loads(path.read_bytes()) if path.exists() else None

    p.ports = await wait_for(ready, timeout=timeout, what=f"{p.name} ports file")
    return p.ports


async def http_ok(url: str) -> bool:
    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
        return r.status == 200


async def start_sim(flavour: str, role: str, workdir: Path) -> Proc:
    """A motor-sim engine (vllm|sglang) as prefill, decode or union; ports in ``.ports``."""
    port = free_port()
    ports = {"http": port}
    if flavour == "vllm":
        argv = [tool("motor-sim"), "vllm", "serve", MODEL, "--port", str(port), "--host", "127.0.0.1",
                "--seed", "0"]
        if role != "union":
            side = free_port()
            ports["kv"] = side
            kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
            argv += ["--kv-transfer-config", orjson.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role}).decode(),
                     "--sim-side-channel-port", str(side)]
    else:
        argv = [tool("motor-sim"), "sglang", "--model-path", MODEL, "--port", str(port), "--host", "127.0.0.1",
                "--random-seed", "0"]
        if role != "union":
            argv += ["--disaggregation-mode", role]
        if role == "prefill":
            ports["bootstrap"] = free_port()
            argv += ["--disaggregation-bootstrap-port", str(ports["bootstrap"])]
    p = await spawn(f"{flavour}-{role}", argv, workdir)
    p.ports = ports
    await wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/health"), timeout=30, what=f"{p.name} health")
    return p


def endpoint_arg(sim: Proc) -> str:
    text = f"127.0.0.1:{sim.ports['http']}"
    if "bootstrap" in sim.ports:
        text += f",bootstrap={sim.ports['bootstrap']}"
    if "kv" in sim.ports:
        text += f",kv={sim.ports['kv']}"
    return text


async def motor_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30.0) -> tuple[int, str, str]:
    """Run the real ``motor`` CLI; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        tool("motor"), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def start_coordinator(workdir: Path, management_key: str | None = None) -> Proc:
    """A real ``motor-coordinator`` on a free port; ``.ports['grpc']``."""
    argv = [tool("motor-coordinator"), "--port", "0", "--ports-file", str(workdir / "coordinator.ports"),
            "--log-format", "text"]
    if management_key is not None:
        key = workdir / "management.key"
        key.write_text(management_key + "\n")
        cfg = workdir / "coordinator.yaml"
        cfg.write_text(f"server:\n  management_key_file: {key}\n")
        argv += ["--config", str(cfg)]
    p = await spawn("coordinator", argv, workdir)
    await read_ports(p, workdir / "coordinator.ports")
    return p


async def start_gateway_proc(workdir: Path, coordinator: str, *extra: str) -> Proc:
    """A real ``motor-gateway`` on a free port; ``.ports['http']``."""
    ports = workdir / "gateway.ports"
    p = await spawn("gateway", [tool("motor-gateway"), "--port", "0", "--coordinator", coordinator,
                                "--ports-file", str(ports), "--log-format", "text", *extra], workdir)
    await read_ports(p, ports)
    return p
