"""Starting Motor's programs as real processes for integration and end-to-end tests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from tests.conftest import tool
from tests.helpers import free_port, kill_group, wait_for


# --- nodemanager ----------------------------------------------------------------------------------
@dataclass
class NodeManagerProc:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    config_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid)
                self.proc.wait(5)
        return int(self.proc.returncode)


async def start_nodemanager(
    tmp_path: Path,
    config: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    wait_ready: bool = True,
    name: str = "nm",
) -> NodeManagerProc:
    """Run ``motor-nodemanager --config <yaml> --ports-file ...`` (own session; output to a log file).

    With *wait_ready*, waits for the ports file (the gRPC server is up) and returns the bound port.
    """
    cfg_path = tmp_path / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    ports = tmp_path / f"{name}.ports.json"
    log_path = tmp_path / f"{name}.log"
    full_env = {k: v for k, v in os.environ.items() if k not in ("USER_CONFIG_PATH", "CONFIG_PATH")}
    full_env.update(env or {})
    argv = [tool("motor-nodemanager"), "--config", str(cfg_path), "--ports-file", str(ports)]
    proc = _spawn_logged(argv, log_path, full_env)
    nm = NodeManagerProc(proc, 0, log_path, cfg_path)
    if wait_ready:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"nodemanager exited with {proc.returncode}:\n{nm.log_text()[-3000:]}")
            return ports.exists()

        try:
            await wait_for(ready, timeout=20, what="nodemanager ports file")
        except RuntimeError as exc:
            raise AssertionError(str(exc)) from None
        nm.port = int(json.loads(ports.read_text())["grpc"])
    return nm


def _spawn_logged(argv: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start *argv* in its own session, stdout+stderr appended to *log_path*."""
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


# --- generic: any console script in its own process group ----------------------------------------
@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0
    ports: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (e.g. SIGKILL to simulate an engine death)."""
        kill_group(self.popen.pid, sig)


def http_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, TimeoutError):
        return None


def http_ready(path: str = "/health") -> Callable[[Proc], bool]:
    return lambda p: http_status(p.url + path, 0.5) == 200


def ports_file_ready(path: Path, key: str = "grpc") -> Callable[[Proc], bool]:
    """Ready once the ``--ports-file`` JSON exists; sets ``proc.ports`` and ``proc.port``."""

    def ready(p: Proc) -> bool:
        try:
            ports = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        p.ports = ports
        p.port = int(ports[key])
        return True

    return ready


async def _stop_group(proc: Proc, grace: float) -> None:
    if proc.alive():
        kill_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.popen.wait, grace)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid, signal.SIGKILL)  # also kills anything left in the group
    try:
        await asyncio.to_thread(proc.popen.wait, 5)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def _spawn_proc(name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    popen = _spawn_logged(list(argv), log_path, {**os.environ, **(env or {})})
    return Proc(name, popen, log_path)


@asynccontextmanager
async def running(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    *,
    ready: Callable[[Proc], Any],
    deadline: float = 90.0,
    env: dict[str, str] | None = None,
    grace: float = 5.0,
) -> AsyncIterator[Proc]:
    """Run *argv* in a new session; yield once ``ready(proc)`` is truthy (checked in a thread,
    with a deadline; an early exit fails at once with the log); SIGTERM then SIGKILL the group.
    The deadline is generous: beside the real-vLLM lane (load average up to 30 on 2 cores) a
    coordinator once had not logged its first line 30 s after it was spawned."""
    proc = _spawn_proc(name, argv, log_dir, env)
    try:

        async def check() -> Any:
            # an exit ends the wait (wait_for counts a raised error as "not yet" and would sit out
            # the whole deadline) and is reported just below
            return not proc.alive() or await asyncio.to_thread(ready, proc)

        try:
            await wait_for(check, timeout=deadline, what=f"{name} to become ready")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n--- {name} log ---\n{proc.log()[-3000:]}") from None
        if not proc.alive():
            raise RuntimeError(f"{name} exited with {proc.popen.returncode}:\n{proc.log()[-3000:]}")
        yield proc
    finally:
        await _stop_group(proc, grace)


# --- engine simulator ----------------------------------------------------------------------------
VLLM_KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}


@asynccontextmanager
async def start_simulator(
    engine: str,
    role: str,
    log_dir: Path,
    *,
    model: str = "sim-model",
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    name: str | None = None,
) -> AsyncIterator[Proc]:
    """``motor-sim`` as a vLLM or SGLang engine; role = union | prefill | decode (| both, vLLM).

    ``proc.extra`` holds ``bootstrap_port`` (SGLang prefill) / ``side_channel_port`` (vLLM)."""
    port = port or free_port()
    extra: dict[str, Any] = {}
    if engine == "vllm":
        side = free_port()
        argv = [tool("motor-sim"), "vllm", "serve", model, "--host", "127.0.0.1", "--port", str(port),
                "--sim-side-channel-port", str(side)]
        if role != "union":
            ktc = {"kv_connector": "NixlConnector", "kv_role": VLLM_KV_ROLES[role]}
            argv += ["--kv-transfer-config", json.dumps(ktc)]
        extra["side_channel_port"] = side
    elif engine == "sglang":
        argv = [tool("motor-sim"), "sglang", "--model-path", model, "--host", "127.0.0.1", "--port", str(port),
                "--disaggregation-mode", "null" if role == "union" else role]
        if role == "prefill":
            bootstrap = free_port()
            argv += ["--disaggregation-bootstrap-port", str(bootstrap)]
            extra["bootstrap_port"] = bootstrap
    else:
        raise ValueError(f"unknown engine {engine!r}")
    argv += list(extra_args)

    def ready(p: Proc) -> bool:
        p.port = port
        return http_status(p.url + "/health", 0.5) == 200

    async with running(name or f"sim-{engine}-{role}-{port}", argv, log_dir, ready=ready, env=env) as proc:
        proc.extra.update(extra)
        yield proc


# --- coordinator ---------------------------------------------------------------------------------
def _coordinator_files(
    log_dir: Path, name: str, config: dict[str, Any] | None, management_key: str | None
) -> tuple[Path, Path]:
    log_dir.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = json.loads(json.dumps(config or {}))
    if management_key is not None:
        key_file = log_dir / f"{name}.key"
        key_file.write_text(management_key + "\n")
        cfg.setdefault("server", {})["management_key_file"] = str(key_file)
    cfg_path = log_dir / f"{name}.json"
    cfg_path.write_text(json.dumps(cfg))
    ports_path = log_dir / f"{name}.ports.json"
    ports_path.unlink(missing_ok=True)
    return cfg_path, ports_path


@asynccontextmanager
async def start_coordinator(
    log_dir: Path,
    config: dict[str, Any] | None = None,
    *,
    management_key: str | None = None,
    name: str = "coordinator",
    extra_args: Sequence[str] = (),
) -> AsyncIterator[Proc]:
    """``motor-coordinator`` with ``--port 0 --ports-file``; ``proc.port`` is the gRPC port."""
    cfg_path, ports_path = _coordinator_files(log_dir, name, config, management_key)
    argv = [tool("motor-coordinator"), "--config", str(cfg_path), "--host", "127.0.0.1", "--port", "0",
            "--ports-file", str(ports_path), "--log-format", "text", *extra_args]
    async with running(name, argv, log_dir, ready=ports_file_ready(ports_path)) as proc:
        yield proc


# --- gateway -------------------------------------------------------------------------------------
def _gateway_files(log_dir: Path, name: str, config: dict[str, Any] | None) -> tuple[Path, Path]:
    log_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = log_dir / f"{name}.json"
    cfg_path.write_text(json.dumps(config or {}))
    ports_path = log_dir / f"{name}.ports.json"
    ports_path.unlink(missing_ok=True)
    return cfg_path, ports_path


@asynccontextmanager
async def start_gateway(
    log_dir: Path,
    coordinators: Sequence[str],
    *,
    config: dict[str, Any] | None = None,
    name: str = "gateway",
    extra_args: Sequence[str] = (),
) -> AsyncIterator[Proc]:
    """``motor-gateway`` with ``--port 0 --ports-file``; ``proc.port`` is the HTTP port, ``proc.url``
    its base URL (OpenAI base URL = ``proc.url + "/v1"``)."""
    cfg_path, ports_path = _gateway_files(log_dir, name, config)
    argv = [tool("motor-gateway"), "--config", str(cfg_path), "--host", "127.0.0.1", "--port", "0",
            "--ports-file", str(ports_path), "--log-format", "text", *extra_args]
    for addr in coordinators:
        argv += ["--coordinator", addr]
    async with running(name, argv, log_dir, ready=ports_file_ready(ports_path, key="http")) as proc:
        yield proc


# --- controller ----------------------------------------------------------------------------------
@asynccontextmanager
async def start_controller(
    log_dir: Path,
    config: dict[str, Any] | None = None,
    *,
    management_key: str | None = None,
    name: str = "controller",
    extra_args: Sequence[str] = (),
) -> AsyncIterator[Proc]:
    """``motor-controller --config <json> --ports-file``; ``proc.port`` is the gRPC port.

    Defaults: port 0 and a store file in *log_dir* (pass the same *log_dir*/name to resume)."""
    cfg: dict[str, Any] = json.loads(json.dumps(config or {}))
    cfg.setdefault("server", {}).setdefault("port", 0)
    cfg.setdefault("store", {}).setdefault("path", str(log_dir / f"{name}.db"))
    cfg.setdefault("log", {}).setdefault("format", "text")
    cfg_path, ports_path = _coordinator_files(log_dir, name, cfg, management_key)
    argv = [tool("motor-controller"), "--config", str(cfg_path), "--ports-file", str(ports_path), *extra_args]
    async with running(name, argv, log_dir, ready=ports_file_ready(ports_path)) as proc:
        yield proc


def sim_instance(iid: int, role: Role, model: str, sim: Proc) -> Instance:
    """An AVAILABLE vLLM instance of one endpoint: the simulator *sim* (for RegisterInstances)."""
    return Instance(iid, role, f"job-{iid}", model, EngineType.VLLM, (Endpoint(0, "127.0.0.1", sim.port),),
                    InstanceStatus.AVAILABLE)
