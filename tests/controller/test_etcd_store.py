"""EtcdStore against a real etcd: the Store Protocol, one-transaction batches, fencing on the
election key, and STORE_UNAVAILABLE (with its status callback) when etcd is gone."""

from __future__ import annotations

import time

import aetcd
import pytest

from motor_common.errors import Unavailable
from motor_controller.etcd_store import LIST_PAGE_KEYS, MAX_TXN_OPS, EtcdStore
from tests.etcd_server import etcd_server

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(60)]


async def test_store_protocol_batches_fencing_and_unavailability() -> None:
    async with etcd_server() as etcd:
        statuses: list[tuple[bool, str]] = []
        store = EtcdStore([etcd.endpoint], "/motor/t/controller", timeout=1.0,
                          on_status=lambda ok, why: statuses.append((ok, why)))  # fmt: skip
        other = EtcdStore([etcd.endpoint], "/motor/other/controller/", timeout=1.0)
        try:
            assert await store.get("meta/epoch") is None
            await store.put("meta/epoch", b"e1")
            await store.batch({"instances/1": b"a", "instances/2": b"b", "jobs/j": b"1"})
            await other.put("instances/9", b"not ours")
            assert await store.get("meta/epoch") == b"e1"
            assert await store.list("instances/") == [("instances/1", b"a"), ("instances/2", b"b")]
            await store.batch({"instances/3": b"c"}, ["instances/1", "jobs/j"])
            assert [k for k, _ in await store.list("")] == ["instances/2", "instances/3", "meta/epoch"]
            await store.delete("instances/2")
            assert await store.get("instances/2") is None

            # a batch larger than etcd's per-transaction limit still lands
            await store.batch({f"nodes/{i:04d}": b"x" for i in range(MAX_TXN_OPS + 5)})
            assert len(await store.list("nodes/")) == MAX_TXN_OPS + 5

            # fenced writes: only while the election key holds our candidate id
            store.fence = ("/motor/t/leader", "me")
            with pytest.raises(Unavailable) as err:
                await store.put("instances/4", b"d")
            assert err.value.reason == "NOT_MASTER"
            async with aetcd.Client(host="127.0.0.1", port=etcd.client_port, timeout=1) as raw:
                await raw.put(b"/motor/t/leader", b"me")
            await store.put("instances/4", b"d")
            assert await store.get("instances/4") == b"d"
            assert statuses == []

            etcd.kill()
            t0 = time.monotonic()
            with pytest.raises(Unavailable) as err:
                await store.get("instances/4")
            assert err.value.reason == "STORE_UNAVAILABLE" and time.monotonic() - t0 < 3.0
            assert statuses and statuses[0][0] is False
        finally:
            await store.close()
            await other.close()


async def test_list_returns_every_key_of_a_prefix_larger_than_a_grpc_reply() -> None:
    """A prefix over gRPC's default 4 MiB reply (10,000 alarms, 1,000 deleted instances with many
    endpoints) is listed whole: in pages, over more than one page, in key order; and so is one
    page of big records over 4 MiB."""
    async with etcd_server() as etcd:
        store = EtcdStore([etcd.endpoint], "/motor/t/controller", timeout=5.0)
        try:
            value = b"v" * 32 * 1024
            keys = [f"alarms/precision/coordinator@c:{i:04d}/1" for i in range(3 * LIST_PAGE_KEYS)]
            for start in range(0, len(keys), 30):  # each transaction under etcd's 1.5 MiB request limit
                await store.batch({k: value + k.encode() for k in keys[start : start + 30]})
            await store.put("alarmsX", b"a neighbour of the prefix")
            assert len(keys) * len(value) > 4 * 1024 * 1024
            listed = await store.list("alarms/")
            assert [k for k, _ in listed] == sorted(keys)
            assert all(v == value + k.encode() for k, v in listed)

            # a few big records (each under etcd's request limit) fill one page beyond 4 MiB
            big = {f"instances/{i}": bytes([i]) * (1200 * 1024) for i in range(1, 5)}
            for k, v in big.items():
                await store.put(k, v)
            assert await store.list("instances/") == sorted(big.items())
        finally:
            await store.close()
