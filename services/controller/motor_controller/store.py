"""Persistence behind a small :class:`Store` Protocol (get/put/delete/list by prefix + batch).

Default backend: **one SQLite file** (stdlib ``sqlite3``, WAL, run on a single-thread executor so
the event loop never blocks). Chosen over an atomically rewritten JSON file because a write costs
O(record), not O(whole state), and a multi-key batch (instance + job incarnation) is one
transaction that survives a crash. The etcd backend (HA, ``etcd_store.EtcdStore``) implements
the same Protocol.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Store(Protocol):
    async def get(self, key: str) -> bytes | None: ...
    async def put(self, key: str, value: bytes) -> None: ...
    async def delete(self, key: str) -> None: ...
    async def list(self, prefix: str) -> list[tuple[str, bytes]]: ...
    async def batch(self, puts: Mapping[str, bytes], deletes: Sequence[str] = ()) -> None: ...
    async def close(self) -> None: ...


class MemoryStore:
    """In-memory store (unit tests)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    async def put(self, key: str, value: bytes) -> None:
        self.data[key] = value

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)

    async def list(self, prefix: str) -> list[tuple[str, bytes]]:
        return sorted((k, v) for k, v in self.data.items() if k.startswith(prefix))

    async def batch(self, puts: Mapping[str, bytes], deletes: Sequence[str] = ()) -> None:
        self.data.update(puts)
        for key in deletes:
            self.data.pop(key, None)

    async def close(self) -> None:
        return None


class SqliteStore:
    """Embedded single-file store (SQLite, WAL)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="motor-store")
        self._db: sqlite3.Connection | None = None

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
        self._db = db

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def open(self) -> SqliteStore:
        """Open (create) the file; a ConfigError naming it when that cannot be done (a directory,
        a path that cannot be made, not an SQLite file): restarting would not help (exit 2)."""
        try:
            await self._run(self._open)
        except (OSError, sqlite3.Error) as exc:
            from motor_common.errors import ConfigError

            why = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"store.path {self.path}: cannot open the controller's store: {why}") from exc
        return self

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    async def get(self, key: str) -> bytes | None:
        def op() -> bytes | None:
            row = self._conn().execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            return None if row is None else bytes(row[0])

        result: bytes | None = await self._run(op)
        return result

    async def put(self, key: str, value: bytes) -> None:
        await self.batch({key: value})

    async def delete(self, key: str) -> None:
        await self.batch({}, [key])

    async def list(self, prefix: str) -> list[tuple[str, bytes]]:
        def op() -> list[tuple[str, bytes]]:
            rows = self._conn().execute(
                "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                (prefix, prefix + "\U0010ffff"),
            ).fetchall()
            return [(str(k), bytes(v)) for k, v in rows]

        result: list[tuple[str, bytes]] = await self._run(op)
        return result

    async def batch(self, puts: Mapping[str, bytes], deletes: Sequence[str] = ()) -> None:
        puts, deletes = dict(puts), list(deletes)

        def op() -> None:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", list(puts.items()))
                db.executemany("DELETE FROM kv WHERE key = ?", [(k,) for k in deletes])
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

        await self._run(op)

    async def close(self) -> None:
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._pool.shutdown(wait=True)


async def open_store(backend: str, path: str) -> Store:
    """The embedded store (the etcd store is built by ``main.serve_ha``: it needs the election)."""
    if backend == "embedded":
        return await SqliteStore(path).open()
    from motor_common.errors import ConfigError

    raise ConfigError(f"store.backend {backend!r}: use motor_controller.etcd_store.EtcdStore")
