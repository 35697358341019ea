"""An outbound TLS channel whose client certificate follows its files (certificate rotation).

:class:`ReloadingChannel` is a ``grpc.aio.Channel``: stubs are built on it once, as on any
channel. Every new call first compares the (inode, mtime, size) of the TLS files (client
certificate, key, CA bundle) with the ones the current channel was built from; when they changed
and the new certificate and key form a pair, a new channel with the new credentials takes the
call and every later one. The previous channel is *drained*, not cut: it takes no new call, its
calls in flight run to their end, and it is closed when the last one ends (or after
``drain_sec``, when the calls still open on it are cancelled; long-lived streams are re-opened by
their callers, on the new channel). A half-written rotation (certificate and key that do not
match, a missing file) keeps the current channel and logs one warning per state of the files.

Checking costs three ``stat`` calls per call; no file is read unless one of them changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from motor_common.errors import ConfigError
from motor_common.tasks import TaskOwner
from motor_common.tls import TlsConfig, channel_credentials, file_stamp

log = logging.getLogger(__name__)

# How long a replaced channel may keep calls open after a rotation before they are cancelled.
DEFAULT_DRAIN_SEC = 600.0

Stamp = tuple[tuple[int, int, int], ...]


class _MultiCallable:
    """Stands for one method of the channel: each call goes to the channel current at that call."""

    def __init__(self, owner: ReloadingChannel, kind: str, method: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self._owner = owner
        self._kind = kind
        self._method = method
        self._args = args
        self._kwargs = kwargs
        self._bound: tuple[grpc.aio.Channel, Callable[..., Any]] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        channel = self._owner.current()
        bound = self._bound
        if bound is None or bound[0] is not channel:
            factory = getattr(channel, self._kind)
            bound = self._bound = (channel, factory(self._method, *self._args, **self._kwargs))
        call = bound[1](*args, **kwargs)
        self._owner.track(channel, call)
        return call


async def _ended(call: Any) -> None:
    with contextlib.suppress(Exception):
        await call.code()


class ReloadingChannel(grpc.aio.Channel):  # type: ignore[misc]
    """A ``grpc.aio`` TLS channel to *address* that re-reads ``tls``'s files when they change."""

    def __init__(self, address: str, tls: TlsConfig, options: Sequence[tuple[str, Any]],
                 *, drain_sec: float = DEFAULT_DRAIN_SEC) -> None:
        if not tls.dials_tls:
            raise ConfigError("a reloading channel needs tls.ca_file")
        self.address = address
        self._tls = tls
        self._options = list(options)
        self.drain_sec = drain_sec  # how long a replaced channel keeps its calls (settable)
        self._paths = [p for p in (tls.cert_file, tls.key_file, tls.ca_file) if p]
        self._stamp = file_stamp(self._paths)
        self._channel = self._open()
        self._refused: Stamp | None = None  # files already found unusable (warned once)
        self._draining = TaskOwner(f"drain:{address}")
        self._replaced: set[grpc.aio.Channel] = set()
        self._calls: dict[grpc.aio.Channel, set[Any]] = {}  # calls not finished yet, per channel
        self.reloads = 0

    def _open(self) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(self.address, channel_credentials(self._tls), options=self._options)

    def current(self) -> grpc.aio.Channel:
        """The channel for a new call, after re-reading the TLS files if they changed."""
        try:
            stamp = file_stamp(self._paths)
        except OSError as exc:
            self._warn(None, f"cannot stat: {exc}")
            return self._channel
        if stamp == self._stamp or stamp == self._refused:
            return self._channel
        try:
            fresh = self._open()
        except ConfigError as exc:
            self._warn(stamp, exc.message)
            return self._channel
        old, self._channel, self._stamp, self._refused = self._channel, fresh, stamp, None
        self.reloads += 1
        log.info("client TLS certificate reloaded; new calls use it, the previous connection is drained",
                 extra={"peer": self.address, "cert_file": self._tls.cert_file})
        self._replaced.add(old)
        self._draining.spawn(self._drain(old), name=f"drain-channel:{self.address}")
        return fresh

    def _warn(self, stamp: Stamp | None, why: str) -> None:
        if stamp is not None and stamp == self._refused:
            return
        self._refused = stamp
        log.warning("client TLS files changed but cannot be loaded; keeping the current certificate: %s", why,
                    extra={"peer": self.address})

    def track(self, channel: grpc.aio.Channel, call: Any) -> None:
        live = self._calls.setdefault(channel, set())
        live.add(call)
        call.add_done_callback(live.discard)
        if call.done():
            live.discard(call)

    async def _drain(self, old: grpc.aio.Channel) -> None:
        """Close *old* once the calls it carries have ended (at most ``drain_sec``; the rest are
        cancelled). No call can start on it any more: new calls go to the current channel."""
        live = [c for c in self._calls.pop(old, set()) if not c.done()]
        waiters = [asyncio.ensure_future(_ended(c)) for c in live]
        try:
            if waiters:
                await asyncio.wait(waiters, timeout=self.drain_sec)
        finally:
            for w in waiters:
                w.cancel()
        self._replaced.discard(old)
        await old.close()

    @property
    def draining(self) -> int:
        """Replaced channels not closed yet."""
        return len(self._replaced)

    # -- grpc.aio.Channel ----------------------------------------------------------------------

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _MultiCallable(self, "unary_unary", method, args, kwargs)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _MultiCallable(self, "unary_stream", method, args, kwargs)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _MultiCallable(self, "stream_unary", method, args, kwargs)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _MultiCallable(self, "stream_stream", method, args, kwargs)

    def get_state(self, try_to_connect: bool = False) -> Any:
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: Any) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self.current().channel_ready()

    async def close(self, grace: float | None = None) -> None:
        """Close the current channel (calls in flight get *grace* seconds) and the drained ones."""
        replaced = list(self._replaced)
        await self._draining.close()
        await asyncio.gather(self._channel.close(grace), *(ch.close(grace) for ch in replaced))
        self._replaced.clear()
        self._calls.clear()

    async def __aenter__(self) -> ReloadingChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close(None)
