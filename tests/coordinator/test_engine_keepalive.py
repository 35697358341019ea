"""The coordinator never writes a request to a connection its engine has closed for idleness.

vLLM and SGLang (uvicorn) close an idle keep-alive connection after 5 s. When this process pauses
(a stalled event loop: the machine is busy) across that moment, the engine's close is not read
until the loop runs again, so the pool still offers the connection as open; a request written to
it fails as a dropped connection, and with one prefill the client got a 503 (CI, session 8: the
real-vLLM PD lane, after 7 s stalls of the coordinator's loop). The pool therefore reuses an idle
connection only for ``dispatch.engine_keepalive_sec``, below the engines' keep-alive, measured in
real time (which a pause does not stop).

The pause is made here on purpose: the test blocks its own loop until the engine (another
process) has closed the idle connection."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from motor_common.domain import Endpoint
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig
from motor_coordinator.engine_client import EngineUnreachable
from tests.procs import start_simulator

BODY = {"model": "sim-model", "prompt": "hello", "max_tokens": 2}
CLOSE_WAIT = "08"  # /proc/net/tcp state: the peer closed, this side did not yet


def _own_socket_inodes() -> set[str]:
    out = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                out.add(link[len("socket:["):-1])
    return out


def _closed_by_peer(port: int) -> bool:
    """A TCP connection of this process to *port* that the peer closed and this side not yet read."""
    own = _own_socket_inodes()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if int(remote.rsplit(":", 1)[1], 16) == port and state == CLOSE_WAIT and inode in own:
                return True
    return False


def _pause_until_closed_by_peer(port: int, deadline_s: float = 20.0) -> None:
    """Block this process's event loop (the pause under test) until the engine closed the idle
    connection; polling with a deadline, never running the loop."""
    end = time.monotonic() + deadline_s
    while not _closed_by_peer(port):
        assert time.monotonic() < end, f"the engine on port {port} did not close the idle connection"
        time.sleep(0.05)


@pytest.mark.parametrize(("keepalive", "reused"), [(0.5, False), (60.0, True)])
async def test_a_connection_the_engine_closed_during_a_pause_is_not_reused(
    tmp_path: Path, keepalive: float, reused: bool
) -> None:
    """keepalive below the engine's (1 s here): the second request opens a new connection and is
    answered. Above it (the old 60 s): the pool hands out the closed connection and the request
    fails as dropped — the hazard this setting exists for, shown so the test cannot pass idly."""
    async with start_simulator("vllm", "union", tmp_path, env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "1"}) as sim:
        # the coordinator's own client, built from its config (dispatch.engine_keepalive_sec)
        client = Coordinator(CoordinatorConfig(dispatch=DispatchConfig(engine_keepalive_sec=keepalive))).client
        await client.start()
        try:
            ep = Endpoint(0, "127.0.0.1", sim.port)
            status, _, _ = await client.read_all(ep, "/v1/completions", BODY, "first")
            assert status == 200
            _pause_until_closed_by_peer(sim.port)
            if reused:
                with pytest.raises(EngineUnreachable) as err:
                    await client.read_all(ep, "/v1/completions", BODY, "second")
                assert err.value.reached  # it counts as dropped while serving: a poison-suspect drop
            else:
                status, _, raw = await client.read_all(ep, "/v1/completions", BODY, "second")
                assert status == 200 and b'"choices"' in raw
        finally:
            await client.close()


def test_the_default_keepalive_is_below_the_engines_and_must_be_positive() -> None:
    assert 0 < DispatchConfig().engine_keepalive_sec < 5.0
    with pytest.raises(ValueError, match="timeouts must be > 0"):
        DispatchConfig(engine_keepalive_sec=0)
