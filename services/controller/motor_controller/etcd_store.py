"""The controller's :class:`~motor_controller.store.Store` on etcd (aetcd client), for HA.

Keys are the store's keys under a prefix (``/motor/<cluster>/controller/`` + ``nodes/…``,
``instances/…``, ``jobs/…``, ``coordinators/…``, ``alarms/…``, ``meta/epoch``, ``meta/format``). Every call has a
timeout. A :meth:`batch` is **one** etcd transaction (up to ``MAX_TXN_OPS`` operations, etcd's
default limit; a larger batch is split, each part atomic).

Reads: :meth:`list` reads a prefix in pages of ``LIST_PAGE_KEYS`` keys (each its own call with its
own timeout), every page at the revision of the first one, so the listing is one consistent
snapshot however large the prefix is (10,000 alarms, 1,000 deleted instance records). A page must
fit the channel's receive limit, ``MAX_RECEIVE_BYTES``, which is far above gRPC's 4 MiB default:
a page of values at etcd's default request limit (1.5 MiB each) still fits.

Fencing: with a ``fence`` (election key, our candidate id) every write is a transaction guarded by
``value(election key) == candidate``, so a controller that lost the election (frozen, partitioned)
cannot overwrite what the new master wrote; such a write fails with ``Unavailable`` reason
``NOT_MASTER``.

Errors (translated here, at the boundary)::

    MotorError
     └── Unavailable  reason STORE_UNAVAILABLE  etcd unreachable / timed out / refused the call
                      reason NOT_MASTER         fenced write: the election key is not ours

Every call reports the store's reachability to ``on_status(available, detail)`` (first failure and
first success after a failure), which the controller turns into a ``STORE_UNAVAILABLE`` alarm.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from motor_common.errors import Unavailable
from motor_common.etcd_election import parse_endpoint

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_TXN_OPS = 128
LIST_PAGE_KEYS = 64
MAX_RECEIVE_BYTES = 128 * 1024 * 1024
OnStatus = Callable[[bool, str], None]
Ops = list[tuple[str, str, bytes]]  # (put|delete, key, value)


class EtcdStore:
    def __init__(
        self,
        endpoints: Sequence[str],
        prefix: str,
        *,
        timeout: float = 2.0,
        fence: tuple[str, str] | None = None,
        on_status: OnStatus | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint")
        self.endpoints = list(endpoints)
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.timeout = timeout
        self.fence = fence
        self.on_status = on_status
        self.available = True
        self._client: Any = None
        self._endpoint_index = 0

    # ---- plumbing ---------------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return (self.prefix + key).encode()

    def _connect(self) -> Any:
        import aetcd  # optional dependency (extras "ha"/"dev"), needed only with store.backend etcd

        if self._client is None:
            host, port = parse_endpoint(self.endpoints[self._endpoint_index % len(self.endpoints)])
            self._client = aetcd.Client(host=host, port=port, timeout=self.timeout, connect_wait_timeout=1,
                                        options={"grpc.max_receive_message_length": MAX_RECEIVE_BYTES})
        return self._client

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        self._endpoint_index += 1  # next call tries the next endpoint
        if client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await client.close()

    def _status(self, available: bool, detail: str = "") -> None:
        if available == self.available:
            return
        self.available = available
        if available:
            log.info("etcd store available again")
        else:
            log.warning("etcd store unavailable: %s", detail)
        if self.on_status is not None:
            self.on_status(available, detail)

    async def _call(self, op: Callable[[Any], Awaitable[T]], what: str) -> T:
        try:
            async with asyncio.timeout(self.timeout):
                result = await op(self._connect())
        except Exception as exc:  # aetcd / grpc / timeout / connection errors, all the same to us
            detail = f"{what}: {type(exc).__name__}: {exc}"[:300]
            await self._drop_client()
            self._status(False, detail)
            raise Unavailable(f"etcd store unavailable ({detail})", reason="STORE_UNAVAILABLE") from exc
        self._status(True)
        return result

    # ---- Store ------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        got = await self._call(lambda c: c.get(self._key(key)), f"get {key}")
        return None if got is None else bytes(got.value)

    async def put(self, key: str, value: bytes) -> None:
        await self.batch({key: value})

    async def delete(self, key: str) -> None:
        await self.batch({}, [key])

    async def list(self, prefix: str) -> list[tuple[str, bytes]]:
        from aetcd import rpc
        from aetcd.utils import prefix_range_end

        start = self._key(prefix)
        end = prefix_range_end(start)
        cut = len(self.prefix)
        out: list[tuple[str, bytes]] = []
        revision = 0  # the first page reads the latest revision; the others read that one
        while True:
            request = rpc.RangeRequest(key=start, range_end=end, limit=LIST_PAGE_KEYS, revision=revision)
            reply = await self._call(functools.partial(self._range, request=request), f"list {prefix}")
            out.extend((bytes(kv.key).decode()[cut:], bytes(kv.value)) for kv in reply.kvs)
            if not reply.more or not reply.kvs:
                return sorted(out)
            revision = revision or reply.header.revision
            start = bytes(reply.kvs[-1].key) + b"\0"  # the next key after this page's last

    async def _range(self, client: Any, request: Any) -> Any:
        # aetcd's get_range() has no limit; its channel and stub are used as its own calls use them
        await client.connect()
        return await client.kvstub.Range(request, timeout=self.timeout, metadata=client.metadata)

    async def batch(self, puts: Mapping[str, bytes], deletes: Sequence[str] = ()) -> None:
        ops: Ops = [("put", k, v) for k, v in puts.items()]
        ops += [("delete", k, b"") for k in deletes]
        for start in range(0, max(len(ops), 1), MAX_TXN_OPS):
            await self._txn(ops[start : start + MAX_TXN_OPS])

    async def _txn(self, ops: Ops) -> None:
        if not ops:
            return

        async def run(client: Any) -> bool:
            tx = client.transactions
            compare = [tx.value(self.fence[0].encode()) == self.fence[1].encode()] if self.fence else []
            success = [tx.put(self._key(k), v) if kind == "put" else tx.delete(self._key(k)) for kind, k, v in ops]
            ok, _ = await client.transaction(compare=compare, success=success, failure=[])
            return bool(ok)

        if not await self._call(run, f"write {ops[0][1]} (+{len(ops) - 1})"):
            raise Unavailable("controller is not master (the election key is not ours)", reason="NOT_MASTER")

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._client.close()
            self._client = None
