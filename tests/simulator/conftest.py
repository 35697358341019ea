"""Fixtures that run real ``motor-sim`` processes on 127.0.0.1 (free ports, process groups)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import free_port

MOTOR_SIM = str(Path(sys.executable).with_name("motor-sim"))



@dataclass
class SimProc:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def http_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, TimeoutError):
        return None


def wait_healthy(sim: SimProc, deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if sim.proc.poll() is not None:
            raise AssertionError(f"motor-sim exited {sim.proc.returncode}:\n{sim.log()}")
        if http_status(sim.url + "/health", 0.5) == 200:
            return
        time.sleep(0.05)
    raise AssertionError(f"motor-sim not healthy within {deadline_s}s:\n{sim.log()}")


def stop(sim: SimProc) -> None:
    if sim.proc.poll() is None:
        try:
            os.killpg(sim.proc.pid, signal.SIGTERM)
            sim.proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    if sim.proc.poll() is None:
        try:
            os.killpg(sim.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sim.proc.wait(timeout=5)


class SimFactory:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[SimProc] = []

    def spawn(self, *args: str, env: dict[str, str] | None = None, port: int | None = None,
              ports: dict[str, int] | None = None) -> SimProc:
        port = port or free_port()
        argv = [MOTOR_SIM, *args, "--host", "127.0.0.1", "--port", str(port)]
        log_path = self.tmp / f"sim-{port}.log"
        full_env = dict(os.environ, **(env or {}))
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=full_env,
                                    start_new_session=True)
        sim = SimProc(proc, port, log_path, ports or {})
        self.procs.append(sim)
        return sim

    def start(self, *args: str, **kw: object) -> SimProc:
        sim = self.spawn(*args, **kw)  # type: ignore[arg-type]
        wait_healthy(sim)
        return sim

    def vllm(self, *extra: str, model: str = "sim-model", role: str | None = None,
             env: dict[str, str] | None = None, policy: str | None = None) -> SimProc:
        """*policy*: vLLM's kv_transfer_config.kv_load_failure_policy (unset: vLLM's default)."""
        args = ["vllm", "serve", model, *extra]
        ports: dict[str, int] = {}
        if role is not None:
            ports["side_channel"] = free_port()
            ktc = {"kv_connector": "NixlConnector", "kv_role": role}
            if policy is not None:
                ktc["kv_load_failure_policy"] = policy
            args += ["--kv-transfer-config", json.dumps(ktc),
                     "--sim-side-channel-port", str(ports["side_channel"])]
        return self.start(*args, env=env, ports=ports)

    def sglang(self, *extra: str, model: str = "sim-model", mode: str = "null",
               env: dict[str, str] | None = None) -> SimProc:
        args = ["sglang", "--model-path", model, "--disaggregation-mode", mode, *extra]
        ports: dict[str, int] = {}
        if mode == "prefill":
            ports["bootstrap"] = free_port()
            args += ["--disaggregation-bootstrap-port", str(ports["bootstrap"])]
        return self.start(*args, env=env, ports=ports)

    def close(self) -> None:
        for sim in self.procs:
            stop(sim)


@pytest.fixture
def sims() -> Iterator[SimFactory]:
    with tempfile.TemporaryDirectory() as tmp:
        factory = SimFactory(Path(tmp))
        try:
            yield factory
        finally:
            factory.close()


@pytest.fixture(scope="module")
def module_sims() -> Iterator[SimFactory]:
    with tempfile.TemporaryDirectory() as tmp:
        factory = SimFactory(Path(tmp))
        try:
            yield factory
        finally:
            factory.close()
