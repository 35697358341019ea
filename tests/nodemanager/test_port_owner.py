"""The engine health check believes a 200 on /health only from the engine it launched: the socket
listening on the engine's port must belong to the launched process or a descendant. Seen in CI:
another program was handed an engine's planned port, the engine exited "address already in use",
the other program answered /health with 200 and the requests routed there got 404.

Real processes throughout: ``python -m http.server`` stands in for the unrelated program (it
answers 200 on ``/health`` when its directory holds a file of that name), the engine is the real
simulator launched by the real nodemanager."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.ports import port_free
from motor_nodemanager import port_owner
from motor_nodemanager.port_owner import Listener, parse_listeners, relevant
from tests.helpers import free_port, wait_for
from tests.nodemanager.conftest import Admin, nm_config
from tests.nodemanager.test_nodemanager_process import Ctl, registered, start_request
from tests.procs import start_nodemanager

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2222 1
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3333 1
   3: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5555 1
   1: 0000000000000000FFFF00000100007F:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6666 1
"""


def test_listeners_on_a_port_are_parsed_from_both_tables() -> None:
    assert parse_listeners(TCP, 8080) == [Listener("127.0.0.1", 1111), Listener("0.0.0.0", 2222)]
    assert parse_listeners(TCP6, 8080) == [Listener("::", 5555), Listener("127.0.0.1", 6666)]
    assert parse_listeners(TCP, 9999) == []


def test_a_listener_bound_to_the_address_wins_over_a_wildcard() -> None:
    both = [Listener("0.0.0.0", 1), Listener("127.0.0.1", 2), Listener("::", 3)]
    assert relevant(both, "127.0.0.1") == [Listener("127.0.0.1", 2)]
    assert relevant(both, "10.0.0.1") == [Listener("0.0.0.0", 1), Listener("::", 3)]
    assert relevant(both, "node-a") == both  # a host name: every listener counts


def _block(size: int) -> int:
    """A port p such that p..p+size-1 are all free (the harness's picks lie 16 apart)."""
    for _ in range(50):
        p = free_port()
        if all(port_free("127.0.0.1", p + i) for i in range(size)):
            return p
    raise RuntimeError("no block of free ports")


def _impostor(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    www = tmp_path / "www"
    www.mkdir(exist_ok=True)
    (www / "health").write_text("ok")
    return subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(www)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _answers_200(port: int) -> bool:
    async with aiohttp.ClientSession() as http, http.get(
        f"http://127.0.0.1:{port}/health", timeout=aiohttp.ClientTimeout(total=5)
    ) as r:
        return r.status == 200


async def test_check_names_the_process_that_holds_the_port(tmp_path: Path) -> None:
    port = _block(1)
    other = _impostor(tmp_path, port)
    # a parent whose child serves the port: a descendant counts as the engine
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess,sys; subprocess.run([sys.executable, '-m', 'http.server', sys.argv[1], "
        "'--bind', '127.0.0.1'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"), str(port + 1)],
        start_new_session=True)  # its own group: the child goes down with it
    try:
        await wait_for(lambda: _answers_200(port), timeout=20, what="the impostor answering /health")
        assert port_owner.check(other.pid, "127.0.0.1", port) == port_owner.Ownership(True)
        engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            verdict = port_owner.check(engine.pid, "127.0.0.1", port)
            assert verdict.owned is False
            assert verdict.detail == (f"port {port} is served by another process (pid {other.pid}), "
                                      f"not by the engine (pid {engine.pid})")
            nothing = port_owner.check(engine.pid, "127.0.0.1", port + 2)
            assert nothing.owned is False and f"nothing listens on port {port + 2}" in nothing.detail
        finally:
            engine.kill()
            engine.wait()
        await wait_for(lambda: not port_free("127.0.0.1", port + 1), timeout=20, what="the child listening")
        assert port_owner.check(parent.pid, "127.0.0.1", port + 1).owned is True
        for dead in (engine.pid, 0):  # exited, or none running: whatever answers is not the engine
            gone = port_owner.check(dead, "127.0.0.1", port)
            assert gone == port_owner.Ownership(False, f"port {port} answers, but the engine process "
                                                       f"(pid {dead}) is not running")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        for p in (other, parent):
            p.kill()
            p.wait()


@pytest.mark.slow
async def test_an_engine_whose_port_another_server_holds_is_never_normal(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    base = _block(2)  # business port base, KV side channel base + 1 (vLLM prefill)
    own = _block(1)
    other = _impostor(tmp_path, base)
    # the simulator launched as vLLM is, but told (last --port wins) to serve another port: it
    # lives and is healthy there, while its planned port answers 200 from the impostor
    cfg = nm_config(server.port, key_file, tmp_path, endpoints_per_node=1, base_port=base,
                    engine={"extra_args": ["--port", str(own)]},
                    health={"startup_grace_sec": 60.0})
    nm = None
    admin = None
    try:
        await wait_for(lambda: _answers_200(base), timeout=20, what="the impostor answering /health")
        nm = await start_nodemanager(tmp_path, cfg)
        admin = Admin(nm.address)
        spec = await registered(impl)
        assert [e.business_port for e in spec.endpoints] == [base]
        resp = await admin.call("StartEngines", start_request(spec))
        (pid,) = resp.pids
        want = f"port {base} is served by another process (pid {other.pid}), not by the engine (pid {pid})"
        await wait_for(lambda: want in nm.log_text(), timeout=30, what="the port-owner warning")
        await wait_for(lambda: _answers_200(own), timeout=20, what="the engine healthy on its own port")

        async def detailed() -> bool:  # after health.failure_threshold (3) such probes in a row
            st = await admin.call("GetStatus", pb.GetStatusRequest())
            return st.endpoints[0].detail == want

        await wait_for(detailed, timeout=10, what="the endpoint's detail naming the port's holder")
        st = await admin.call("GetStatus", pb.GetStatusRequest())
        (ep,) = st.endpoints
        assert ep.status != tpb.ENDPOINT_STATUS_NORMAL and not ep.was_normal and ep.detail == want
        ready = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert not ready.ready and ready.reason == "not all endpoints NORMAL: endpoint 0 initial"
        n = len(impl.frames)
        await wait_for(lambda: len(impl.frames) >= n + 3, timeout=10, what="more heartbeats")
        assert impl.frames and all(e.status != tpb.ENDPOINT_STATUS_NORMAL
                                   for f in impl.frames for e in f.endpoints)
        assert nm.log_text().count(f"engine not healthy: {want}") == 1  # warned once, not on every poll
    finally:
        if admin is not None:
            await admin.close()
        if nm is not None:
            nm.terminate()
        other.kill()
        other.wait()
