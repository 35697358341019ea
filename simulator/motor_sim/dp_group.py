"""Emulated data-parallel collective group, for the vLLM fault-tolerance surface.

In a real DP+EP deployment the ranks share collectives: when one rank dies, the survivors' next
collective fails and they report themselves ``unhealthy`` until an orchestrator removes the dead rank
(``/fault_tolerance/apply`` ``scale_down``). motor-sim ranks are independent processes, so this module
gives them the same observable behaviour over plain TCP on ``--data-parallel-address`` /
``--data-parallel-rpc-port`` (only with the fault-tolerance surface on, ``--sim-zmq-pub-port``):

- rank 0 listens; every other rank connects and sends ``{"rank": r}`` (one JSON line), retrying until
  rank 0 is up;
- a member whose connection drops is *lost*; rank 0 tells the others ``{"lost": [...]}``;
- a member that loses its connection to rank 0 counts rank 0 as lost;
- the group is *formed* once every rank joined (rank 0: all members connected; a member: connected);
  until then ``/health`` answers 503, as vLLM's DP ranks handshake before the engine is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import orjson

log = logging.getLogger("motor_sim.dp_group")


class DpGroup:
    def __init__(self, host: str, port: int, rank: int, size: int, on_change: Callable[[], None]) -> None:
        self.host, self.port, self.rank, self.size = host, port, rank, size
        self.lost: set[int] = set()
        self._on_change = on_change
        self._members: dict[int, asyncio.StreamWriter] = {}
        self._joined = False
        self._server: asyncio.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.rank == 0:
            self._server = await asyncio.start_server(self._serve, "0.0.0.0" if self.host in ("", "0.0.0.0")
                                                      else self.host, self.port, reuse_address=True)  # fmt: skip
        else:
            self._task = asyncio.create_task(self._member(), name="dp-group-member")

    @property
    def formed(self) -> bool:
        if self.rank == 0:
            return self._joined or len(self._members) >= self.size - 1
        return self._joined

    def _mark_lost(self, ranks: set[int]) -> None:
        new = ranks - self.lost - {self.rank}
        if new:
            self.lost |= new
            log.warning("dp group: peer rank(s) %s lost", sorted(new))
            self._on_change()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rank: int | None = None
        try:
            hello = orjson.loads(await reader.readline())
            rank = int(hello["rank"])
            self._members[rank] = writer
            if len(self._members) >= self.size - 1:
                self._joined = True  # formed once; a later loss is a lost peer, not a start-up
            if self.lost:
                writer.write(orjson.dumps({"lost": sorted(self.lost)}) + b"\n")
            while await reader.readline():
                pass
        except (OSError, ValueError, KeyError, orjson.JSONDecodeError):
            pass
        finally:
            if rank is not None and self._members.get(rank) is writer:
                del self._members[rank]
                self._mark_lost({rank})
                msg = orjson.dumps({"lost": sorted(self.lost)}) + b"\n"
                for w in self._members.values():
                    with contextlib.suppress(OSError):
                        w.write(msg)
            writer.close()

    async def _member(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.host or "127.0.0.1", self.port)
                break
            except OSError:
                await asyncio.sleep(0.2)
        writer.write(orjson.dumps({"rank": self.rank}) + b"\n")
        self._joined = True
        try:
            while line := await reader.readline():
                with contextlib.suppress(ValueError, KeyError, orjson.JSONDecodeError):
                    self._mark_lost({int(r) for r in orjson.loads(line)["lost"]})
        except OSError:
            pass
        self._mark_lost({0})
        writer.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._server is not None:
            self._server.close()
            for w in self._members.values():
                w.close()
