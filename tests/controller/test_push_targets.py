"""Which coordinators a controller pushes to (with the management key): its configured ones and at
most one master announced in the current term. In-memory coordinators and store, real Controller."""

from __future__ import annotations

from typing import Any

import orjson

from motor_controller.codec import KEYS
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.store import MemoryStore
from tests.controller.test_pusher import MemoryCoordinator


class Coord(MemoryCoordinator):
    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class NoNodeManagers:
    async def close(self) -> None:
        return None


def controller(store: MemoryStore, made: dict[str, Coord]) -> Controller:
    def factory(address: str) -> Coord:
        made[address] = Coord(address)
        return made[address]

    return Controller(ControllerConfig(coordinators=["conf:1"]), store, NoNodeManagers(),  # type: ignore[arg-type]
                      [Coord("conf:1")], coordinator_factory=factory)


def targets(ctl: Controller) -> list[str]:
    return sorted(p.client.address for p in ctl.pushers)


async def test_a_new_announced_master_replaces_the_previous_one_and_stale_addresses_are_dropped() -> None:
    store = MemoryStore()
    for address in ("old-run:1", "conf:1"):  # generations persisted by earlier runs
        await store.put(f"{KEYS.COORDINATOR}{address}", orjson.dumps({"generation": 7}))
    made: dict[str, Any] = {}
    ctl = controller(store, made)
    await ctl.load()
    assert targets(ctl) == ["conf:1"]
    assert [k for k, _ in await store.list(KEYS.COORDINATOR)] == [f"{KEYS.COORDINATOR}conf:1"]
    assert ctl.pushers[0].state.generation == 7  # the configured one keeps its generation

    await ctl.on_coordinator_promoted("pod-a:1")
    assert targets(ctl) == ["conf:1", "pod-a:1"]
    await ctl.on_coordinator_promoted("pod-a:1")  # repeated announcement: no duplicate
    assert targets(ctl) == ["conf:1", "pod-a:1"]
    await store.put(f"{KEYS.COORDINATOR}pod-a:1", orjson.dumps({"generation": 3}))
    await ctl.on_coordinator_promoted("pod-b:1")  # a newer master: the previous one is dropped for good
    assert targets(ctl) == ["conf:1", "pod-b:1"] and made["pod-a:1"].closed
    assert await store.get(f"{KEYS.COORDINATOR}pod-a:1") is None
    await ctl.on_coordinator_promoted("pod-c:1")
    await ctl.pause()  # lost the election; a later term starts from the configuration only
    await ctl.load()
    assert targets(ctl) == ["conf:1"] and made["pod-c:1"].closed and ctl.announced_master is None
    await ctl.on_coordinator_promoted("pod-d:1")
    await ctl.on_coordinator_promoted("conf:1")  # a configured coordinator won: pod-d's term is over
    assert targets(ctl) == ["conf:1"] and made["pod-d:1"].closed
    await ctl.close()
