"""Deleted instance records are bounded history (pure decision, then the real Controller applying it)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from motor_controller import codec
from motor_controller import controller as controller_module
from motor_controller.codec import KEYS
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.model import InstanceState, ManagedInstance
from motor_controller.reconcile import deleted_to_forget
from motor_controller.store import MemoryStore
from tests.controller.test_terminate_retry import NodeManagers


def record(iid: int, state: InstanceState, at: float) -> ManagedInstance:
    return ManagedInstance(id=iid, job_name=f"job-{iid}", incarnation=0, state=state, instance=None,
                           node_ids=(), master_address="", state_changed_at=at)


def test_the_oldest_deleted_records_beyond_the_bound_are_forgotten_and_nothing_else() -> None:
    insts = {i: record(i, InstanceState.DELETED, at=100.0 - i) for i in range(1, 6)}  # 5 is the oldest
    insts[9] = record(9, InstanceState.ACTIVE, at=0.0)
    insts[8] = record(8, InstanceState.RECOVERING, at=0.0)
    assert deleted_to_forget(insts, keep=5) == []
    assert deleted_to_forget(insts, keep=3) == [5, 4]
    assert deleted_to_forget(insts, keep=0) == [5, 4, 3, 2, 1]


async def test_the_controller_forgets_them_in_memory_and_in_its_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_module, "MAX_DELETED_KEPT", 3)
    store = MemoryStore()
    ctl = Controller(ControllerConfig(), store, NodeManagers())  # type: ignore[arg-type]
    for i in range(1, 6):
        mi = record(i, InstanceState.DELETED, at=float(i))  # 1 is the oldest
        ctl.instances[i] = mi
        await store.put(f"{KEYS.INSTANCE}{i}", codec.encode_instance(mi))
    ctl.fault_manager.failed[1] = "engine_relaunch"
    await ctl.reconcile_once()
    assert sorted(ctl.instances) == [3, 4, 5]
    assert sorted(k for k, _ in await store.list(KEYS.INSTANCE)) == [f"{KEYS.INSTANCE}{i}" for i in (3, 4, 5)]
    assert 1 not in ctl.fault_manager.failed
    ctl.instances[6] = replace(record(6, InstanceState.DELETED, at=6.0))
    await ctl.reconcile_once()
    assert sorted(ctl.instances) == [4, 5, 6]
    await ctl.close()
