"""The state dir of ``motor up``: one fleet at a time, and only a state dir this version can use.

- A lock (``up.lock``, ``flock``; released by the kernel even when ``motor up`` is SIGKILLed) is
  held for the life of ``motor up``: a second ``motor up`` on the same state dir says which one is
  running and where, instead of starting a second fleet on the same store.
- Machine-wide, every running ``motor up`` claims the ports its programs serve on
  (:class:`PortClaims`), so another ``motor up`` never picks one while its program is down for a
  restart.
- The state dir must be this user's and not writable by every user (:func:`check_private`).
- ``state-format`` records the layout of the state dir. A state dir written by an older Motor
  (no marker, but a store or configs from before) or a newer one is refused with what to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from motor_cli import target
from motor_common.atomic_file import write_atomic
from motor_common.errors import ConfigError, FailedPrecondition

# 2: instance ids <= 2^53 - 1 (the controller's store holds them), the state-format marker itself.
STATE_FORMAT = 2
FORMAT_FILE = "state-format"
LOCK_FILE = "up.lock"
# What an older `motor up` left in a state dir.
_OLD_SIGNS = ("controller.db", "management.key", "fleet.json", "coordinator.yaml", "controller.yaml", "logs")


def check_format(state_dir: Path) -> None:
    """Raise ConfigError (with what to do) when *state_dir* was written by another version."""
    marker = state_dir / FORMAT_FILE
    remedy = (f"remove it (rm -rf {state_dir}: it holds only this local fleet's configs, logs, key and "
              f"store) or pass another --state-dir")
    if marker.exists():
        try:
            found = int(marker.read_text().strip())
        except (OSError, ValueError):
            found = 0
        if found == STATE_FORMAT:
            return
        if found > STATE_FORMAT:
            raise ConfigError(f"state dir {state_dir} was written by a newer Motor (state format {found}, this "
                              f"version reads {STATE_FORMAT}): run that version, or {remedy}")
        raise ConfigError(f"state dir {state_dir} was written by an older Motor (state format {found}, this "
                          f"version needs {STATE_FORMAT}): {remedy}")
    old = [name for name in _OLD_SIGNS if (state_dir / name).exists()]
    if old:
        raise ConfigError(f"state dir {state_dir} was written by an older Motor (it has {', '.join(old)} but no "
                          f"{FORMAT_FILE}; its store may hold instance ids this version no longer uses): {remedy}")


def write_format(state_dir: Path) -> None:
    """Atomically: a crash mid-write would leave a marker that reads as "state format 0"."""
    write_atomic(state_dir / FORMAT_FILE, f"{STATE_FORMAT}\n", mode=0o644)


@contextlib.contextmanager
def exclusive(state_dir: Path) -> Iterator[None]:
    """Hold the state dir's lock for the block; FailedPrecondition naming the running fleet
    (pid, gateway URL) when another ``motor up`` holds it."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(state_dir)
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FailedPrecondition(_already_running(state_dir, fd), reason="FLEET_RUNNING") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def lock_holder(state_dir: Path) -> int | None:
    """The pid of the ``motor up`` holding *state_dir*'s lock (one still starting: it has not
    written ``fleet.json`` yet), or None when no process holds it; 0 when the holder has not
    written its pid yet."""
    try:
        fd = os.open(state_dir / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return int(os.pread(fd, 32, 0).decode().strip() or 0)
            except ValueError:
                return 0
        return None  # free (our shared lock ends with the close below)
    finally:
        os.close(fd)


def check_private(state_dir: Path) -> None:
    """ConfigError unless *state_dir* is this user's and not writable by every user: ``motor up``
    writes keys, configs and its lock there, and whoever else can write there can plant a symlink
    that one of those writes follows (``up.lock`` → a file of this user: truncated). Group-write is
    allowed (a user-private group under umask 002); a new state dir is made 0700."""
    st = state_dir.stat()
    if st.st_uid != os.getuid():
        why = f"belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})"
    elif st.st_mode & 0o002:
        why = f"can be written by every user (mode {st.st_mode & 0o7777:04o})"
    else:
        return
    raise ConfigError(f"state dir {state_dir} {why}: whoever can write there can make motor up overwrite a file "
                      f"of yours through a planted symlink; use a directory of your own (chmod o-w it) or "
                      f"pass another --state-dir")


def _already_running(state_dir: Path, fd: int) -> str:
    try:
        pid = int(os.pread(fd, 32, 0).decode().strip() or 0)
    except ValueError:
        pid = 0
    fleet = target.running_fleet(state_dir)
    where = []
    if pid:
        where.append(f"motor up pid {pid}")
    if fleet is not None and fleet.data.get("gateway_url"):
        co_located = (fleet.data.get("topology") or {}).get("name") == "co-located"
        where.append(f"{'OpenAI front' if co_located else 'gateway'} {fleet.data['gateway_url']}")
        if not fleet.data.get("ready"):
            where.append("still starting")
    detail = f" ({', '.join(where)})" if where else ""
    return (f"a fleet is already running in {state_dir}{detail}; stop it with `motor down --state-dir "
            f"{state_dir}` (or Ctrl-C in its terminal), or pass another --state-dir")


def _shared_path_error(path: Path, exc: OSError) -> ConfigError:
    if path.is_symlink():
        return ConfigError(f"{path} (shared by every motor up on this machine) is a symbolic link, which motor up "
                           f"never follows there (someone may have planted it): remove it and run motor up again")
    return ConfigError(f"cannot open {path} (shared by every motor up on this machine): {exc.strerror or exc}")


class PortPickLock:
    """Machine-wide lock held by ``motor up`` from picking its ports until its programs have bound
    them, so two ``motor up`` starting at the same moment (two operators, two test runs) never pick
    the same free port (each scan happens while the other's programs already hold theirs)."""

    PATH = Path(tempfile.gettempdir()) / "motor-up-ports.lock"

    def __init__(self, timeout: float = 60.0, path: Path | None = None) -> None:
        self._fd: int | None = None
        self.timeout = timeout
        self.path = path or self.PATH

    def acquire(self) -> bool:
        """Wait for the lock (at most ``timeout``); False when a stuck holder made us go ahead anyway."""
        # Shared by every user of the machine: read-only is enough for flock (another user's file
        # may not be writable), and the creator opens it to everyone (the umask narrowed 0o666).
        # Never through a symlink: another user could plant one at this shared path pointing at a
        # file of ours, and the fchmod below would make that file writable by everyone.
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as exc:
            raise _shared_path_error(self.path, exc) from exc
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_uid == os.getuid():
                os.fchmod(fd, 0o666)
        deadline = time.monotonic() + self.timeout
        self._fd = fd
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:  # a stuck holder: pick anyway (the old behaviour)
                    return False
                time.sleep(0.05)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class PortClaims:
    """The ports every running ``motor up`` on this machine serves on: one file per ``motor up``
    (``<tmp>/motor-up-ports.d/<pid>.json``: its pid, the process's start time and its ports).

    A program ``motor up`` restarts binds the same port again, and in between (the restart delay)
    the port is free: another ``motor up`` picking ports then would take it, the restart would fail
    with "port in use", and the first fleet would stop. So pickers skip every live claim's ports
    (:meth:`claimed`), read and written under :class:`PortPickLock`. A claim whose process is gone
    (a SIGKILLed ``motor up``) is stale: ignored and removed."""

    DIR = Path(tempfile.gettempdir()) / "motor-up-ports.d"

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or self.DIR
        self._own: Path | None = None

    def claimed(self) -> set[int]:
        """The ports of every live claim but this process's own."""
        ports: set[int] = set()
        try:
            files = list(self.dir.glob("*.json"))
        except OSError:
            return ports
        for path in files:
            try:
                claim = json.loads(path.read_text())
                pid, started = int(claim["pid"]), float(claim["started"])
                theirs = {int(p) for p in claim["ports"]}
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written, or not ours to read: it holds no ports
            if pid == os.getpid():
                continue
            if target.process_is(pid, started):
                ports |= theirs
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        return ports

    def claim(self, ports: Iterable[int]) -> None:
        """Claim *ports* for this process (replacing its earlier claim) until :meth:`release`."""
        self.dir.mkdir(mode=0o1777, parents=True, exist_ok=True)
        try:  # the directory itself, never a symlink planted in its place (its chmod would follow)
            dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            raise _shared_path_error(self.dir, exc) from exc
        try:
            with contextlib.suppress(OSError):  # every user claims here (the umask narrowed the mode)
                if os.fstat(dfd).st_uid == os.getuid():
                    os.fchmod(dfd, 0o1777)
        finally:
            os.close(dfd)
        pid = os.getpid()
        path = self.dir / f"{pid}.json"
        body = {"pid": pid, "started": target.started_at(pid), "ports": sorted(set(ports))}
        # A new file of a random name (O_EXCL), renamed over the claim: every user writes in this
        # directory, and a fixed temp name (".<pid>.tmp") planted as a symlink had this write go
        # through it into a file of ours.
        write_atomic(path, json.dumps(body), mode=0o644)  # readable by every other motor up
        self._own = path

    def release(self) -> None:
        if self._own is not None:
            with contextlib.suppress(OSError):
                self._own.unlink()
            self._own = None


