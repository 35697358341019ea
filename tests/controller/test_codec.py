"""Store records written by another version, or damaged, and what the controller does with them:
the codec ignores fields it does not know; at load a node or alarm that still cannot be decoded is
skipped (its owner sends it again), an instance that cannot be decoded stops the load with an error
naming its key. Pure codec tests, then the real Controller on a real SqliteStore."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from motor_common.errors import Internal
from motor_controller import codec
from motor_controller.alarms import Alarm, AlarmAction, AlarmKind
from motor_controller.codec import KEYS, RecordError
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.metrics import ControllerCollector
from motor_controller.model import InstanceState, ManagedInstance
from motor_controller.store import SqliteStore
from tests.controller.factories import record, spec
from tests.controller.test_push_targets import NoNodeManagers
from tests.controller.test_pusher import inst

ALARM = Alarm(AlarmKind.PRECISION, AlarmAction.RAISE, "coordinator@c:1", (11, 22), "c:1", "wrong answer", 1.0)
INSTANCE = ManagedInstance(id=5, job_name="j5", incarnation=0, state=InstanceState.ACTIVE, instance=inst(5),
                           node_ids=("j5-n0",), master_address="", state_changed_at=1.0)


def node_json(job: str = "j2") -> dict[str, Any]:
    d: dict[str, Any] = orjson.loads(codec.encode_node(record(spec(job=job))))
    return d


def newer_node() -> bytes:
    """A node record from a version that added fields to the record, its spec, an endpoint and
    the capabilities."""
    d = node_json()
    d["spec"]["endpoints"] = [dict(e, numa_node=0) for e in d["spec"]["endpoints"]]
    d["spec"]["capabilities"]["pd_migration"] = True
    d["spec"]["rack"] = "r1"
    d["fingerprint"] = "x"
    return orjson.dumps(d)


def test_records_with_fields_from_a_newer_version_decode_to_what_this_version_knows() -> None:
    assert codec.decode_node(newer_node()).spec == spec(job="j2")
    d = orjson.loads(codec.encode_instance(INSTANCE))
    d["instance"]["endpoints"] = [dict(e, numa_node=0) for e in d["instance"]["endpoints"]]
    d["priority"] = 3
    assert codec.decode_instance(orjson.dumps(d)) == INSTANCE
    assert codec.decode_alarm(orjson.dumps({**orjson.loads(codec.encode_alarm(ALARM)), "severity": "major"})) == ALARM


@pytest.mark.parametrize("raw", [
    codec.encode_node(record(spec(job="j2")))[:40],  # truncated
    orjson.dumps({**node_json(), "spec": {**node_json()["spec"], "role": "router"}}),  # an unknown enum value
    orjson.dumps({"registered_at": 1.0}),  # a field it needs is missing
    orjson.dumps([1, 2]),  # not a record at all
])
def test_a_node_record_that_cannot_be_decoded_is_a_record_error_naming_its_key(raw: bytes) -> None:
    with pytest.raises(RecordError) as err:
        codec.decode("nodes/j2-n0", codec.decode_node, raw)
    assert err.value.key == "nodes/j2-n0" and "'nodes/j2-n0'" in str(err.value)


async def store_with(tmp_path: Path, extra: dict[str, bytes]) -> SqliteStore:
    store = await SqliteStore(tmp_path / "controller.db").open()
    await store.batch({
        f"{KEYS.NODE}ok-n0": codec.encode_node(record(spec(job="ok"))),
        f"{KEYS.INSTANCE}5": codec.encode_instance(INSTANCE),
        codec.alarm_store_key(ALARM): codec.encode_alarm(ALARM),
        **extra,
    })
    return store


async def test_load_skips_nodes_and_alarms_that_cannot_be_decoded_and_loads_newer_ones(tmp_path: Path) -> None:
    bad_alarm = orjson.dumps({**orjson.loads(codec.encode_alarm(ALARM)), "kind": "disk_full", "source": "x"})
    store = await store_with(tmp_path, {
        f"{KEYS.NODE}j2-n0": newer_node(),
        f"{KEYS.NODE}j3-n0": codec.encode_node(record(spec(job="j3")))[:40],
        f"{KEYS.ALARM}disk_full/x/": bad_alarm,
    })
    ctl = Controller(ControllerConfig(), store, NoNodeManagers())  # type: ignore[arg-type]
    try:
        await ctl.load()
        assert sorted(ctl.nodes) == ["j2-n0", "ok-n0"] and sorted(ctl.instances) == [5]
        assert [a.key for a in ctl.alarms.active()] == [ALARM.key]
        assert sorted(ctl.unreadable) == [f"{KEYS.ALARM}disk_full/x/", f"{KEYS.NODE}j3-n0"]
        gauge = next(m for m in ControllerCollector(ctl).collect() if m.name == "motor_controller_store_records_unreadable")
        assert {s.labels["prefix"]: s.value for s in gauge.samples} == {"nodes": 1.0, "alarms": 1.0}
        # skipped, not deleted: a version that can read them still finds them
        assert await store.get(f"{KEYS.NODE}j3-n0") is not None
    finally:
        await ctl.close()
        await store.close()


async def test_load_refuses_an_instance_record_that_cannot_be_decoded_and_names_its_key(tmp_path: Path) -> None:
    store = await store_with(tmp_path, {f"{KEYS.INSTANCE}6": orjson.dumps({"id": 6, "state": "draining"})})
    ctl = Controller(ControllerConfig(), store, NoNodeManagers())  # type: ignore[arg-type]
    try:
        with pytest.raises(Internal) as err:
            await ctl.load()
        assert err.value.reason == "STORE_RECORD_UNREADABLE" and err.value.metadata == {"key": f"{KEYS.INSTANCE}6"}
        assert "'instances/6'" in err.value.message
    finally:
        await ctl.close()
        await store.close()


async def test_load_marks_a_store_without_a_format_as_this_versions_and_loads_it(tmp_path: Path) -> None:
    """A store written before ``meta/format`` existed is format 1: it loads, and the key is written."""
    store = await store_with(tmp_path, {})
    ctl = Controller(ControllerConfig(), store, NoNodeManagers())  # type: ignore[arg-type]
    try:
        await ctl.load()
        assert sorted(ctl.instances) == [5]
        assert await store.get(KEYS.META_FORMAT) == str(codec.STORE_FORMAT).encode() == b"1"
        await ctl.load()  # and again, now with the key
        assert sorted(ctl.instances) == [5]
    finally:
        await ctl.close()
        await store.close()


@pytest.mark.parametrize(("raw", "reason"), [
    (str(codec.STORE_FORMAT + 1).encode(), "STORE_FORMAT_NEWER"),
    (b"two", "STORE_RECORD_UNREADABLE"),
    (b"0", "STORE_RECORD_UNREADABLE"),
])
async def test_load_refuses_a_store_in_a_newer_or_unreadable_format_and_changes_nothing(
        tmp_path: Path, raw: bytes, reason: str) -> None:
    """A downgrade must not act on (and then overwrite) records a newer version laid out
    differently: the load stops before reading any record, and writes nothing (no epoch)."""
    store = await store_with(tmp_path, {KEYS.META_FORMAT: raw})
    before = await store.list("")
    ctl = Controller(ControllerConfig(), store, NoNodeManagers())  # type: ignore[arg-type]
    try:
        with pytest.raises(Internal) as err:
            await ctl.load()
        assert err.value.reason == reason and err.value.metadata["key"] == KEYS.META_FORMAT
        if reason == "STORE_FORMAT_NEWER":
            assert err.value.message.startswith(f"the store holds records in format {codec.STORE_FORMAT + 1}, written "
                                                "by a newer Motor") and "run that version or a newer one" in err.value.message
        assert ctl.instances == {} and await store.list("") == before
    finally:
        await ctl.close()
        await store.close()


def test_an_instance_record_written_before_routable_until_loads_as_not_kept_in_routing() -> None:
    old = orjson.loads(codec.encode_instance(INSTANCE))
    del old["routable_until"]  # what a version without node_lost_routing_grace_sec wrote
    assert codec.decode_instance(orjson.dumps(old)) == INSTANCE and INSTANCE.routable_until == 0.0
    kept = replace(INSTANCE, state=InstanceState.INACTIVE, routable_until=1300.5)
    assert codec.decode_instance(codec.encode_instance(kept)) == kept
