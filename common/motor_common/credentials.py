"""Who may call what: operator, node and inference credentials, and the audit log of mutations.

Three kinds of credential, each a set of *named* keys in a file (:class:`KeyFile`):

- **operator** keys (``server.auth.operator_keys_file``): the admin RPCs (ControllerAdminService,
  the coordinator's InstanceRegistryService, the nodemanager's services). The controller is an
  operator of the coordinators and nodemanagers it drives (its ``auth.key_file``). Every mutation
  made with an operator key is logged on the ``motor.audit`` logger: who, what, request id, result.
- **node** keys (``server.auth.node_keys_file``, on the controller): what nodemanagers (and
  coordinators reporting alarms) present to the controller's ControllerService. A node key cannot
  call an admin RPC, an operator key cannot register a node.
- **inference** keys (``server.auth.inference_keys_file`` on the coordinator, ``api_key_file`` on
  the gateway): the coordinator's DispatchService (metadata ``authorization: Bearer <key>``) and
  the OpenAI routes.

The older single ``server.management_key_file`` still works: its key is accepted as an operator
(named ``management``) and as a node credential, and is what the program presents when it calls
others unless ``auth.key_file`` is set.

Key files are YAML mappings ``name: key`` (one line each), or a single bare key (named
``default``). They are re-read when they change (checked at most every ``RELOAD_CHECK_SEC``), so
keys are rotated without a restart; an unreadable or empty new version keeps the old keys (logged).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import yaml

from motor_common.errors import ConfigError

log = logging.getLogger(__name__)

# A key file holds a key, or a few hundred named keys or digests: anything larger is not one (a
# wrong path such as /dev/zero or a log file would otherwise be read whole).
MAX_KEY_FILE_BYTES = 1024 * 1024


def read_key_text(path: str, what: str) -> str:
    """The text of key file *path* (UTF-8, at most :data:`MAX_KEY_FILE_BYTES`); ConfigError naming
    *what* and the path otherwise."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file {path}: {exc.strerror}") from exc
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{what} file {path} is larger than {MAX_KEY_FILE_BYTES} bytes: not a key file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} file {path} is not UTF-8 text (byte {exc.start}): not a key file") from exc
audit_log = logging.getLogger("motor.audit")

T = TypeVar("T")
RELOAD_CHECK_SEC = 0.5
MAX_KEY_NAME = 64


class Role(enum.StrEnum):
    OPERATOR = "operator"
    NODE = "node"
    INFERENCE = "inference"


@dataclass(frozen=True)
class Principal:
    """Who made a call: the key's name and the roles its key grants."""

    name: str
    roles: frozenset[Role]


@dataclass(frozen=True)
class AuthConfig:
    """``server.auth``: the keys this program accepts, and the one it presents."""

    # Named operator keys accepted by this program's admin RPCs.
    operator_keys_file: str | None = None
    # Named node keys accepted by the controller's ControllerService (register, heartbeat, faults).
    node_keys_file: str | None = None
    # Named inference keys accepted by the coordinator's DispatchService (Dispatch, ListModels).
    inference_keys_file: str | None = None
    # The credential this program presents when it calls another program: the controller's
    # operator key (to coordinators and nodemanagers), a node key (nodemanager and coordinator
    # to the controller). Default: server.management_key_file.
    key_file: str | None = None


def parse_keys(text: str, source: str) -> dict[str, str]:
    """name → key from a key file's text (a ``name: key`` mapping or one bare key)."""
    stripped = text.strip()
    if not stripped:
        raise ConfigError(f"key file {source} is empty")
    try:
        data = yaml.safe_load(stripped)
    except yaml.YAMLError:
        data = None
    if not isinstance(data, Mapping):
        if len(stripped.split()) != 1:
            raise ConfigError(f"key file {source} must hold one key, or 'name: key' lines")
        return {"default": stripped}
    keys: dict[str, str] = {}
    for name, key in data.items():
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_KEY_NAME or not name.isprintable():
            raise ConfigError(f"key file {source}: key names must be 1..{MAX_KEY_NAME} printable characters")
        if not isinstance(key, str | int) or len(str(key)) < 8:
            raise ConfigError(f"key file {source}: the key of {name!r} must be a string of at least 8 characters")
        keys[name] = str(key)
    if not keys:
        raise ConfigError(f"key file {source} holds no key")
    return keys


class _WatchedFile(Generic[T]):
    """A file read at start and re-read when it changes (checked at most every
    ``RELOAD_CHECK_SEC``, at the next use); a new version that cannot be used keeps the previous
    one (logged). Subclasses say how the file is read (:meth:`_load`)."""

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._value: T = self._load()
        self._checked = time.monotonic()
        self.reloads = 0

    def _stat(self) -> tuple[int, int]:
        """(mtime, size): what tells a changed file from the version read."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise ConfigError(f"cannot read {self.what} file {self.path}: {exc.strerror}") from exc
        return st.st_mtime_ns, st.st_size

    def _text(self) -> str:
        return read_key_text(self.path, self.what)

    def _load(self) -> T:
        raise NotImplementedError

    def _current(self) -> T:
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_SEC:
            return self._value
        with self._lock:
            self._checked = now
            try:
                stamp = self._stat()
                if stamp == self._stamp:
                    return self._value
                value = self._load()
            except ConfigError as exc:
                log.warning("%s changed but cannot be used; keeping the previous version: %s", self.what, exc.message)
                return self._value
            self._value, self._stamp = value, stamp
            self.reloads += 1
            log.info("%s reloaded", self.what, extra={"file": self.path})
            return value


DIGEST_PREFIX = "sha256:"


@dataclass(frozen=True, slots=True)
class _Key:
    digest: bytes  # SHA-256 of the key: what a presented key is compared with
    plain: str | None  # the key itself; None when the file holds only its digest


def _key(name: str, value: str, source: str) -> _Key:
    """A key file entry: the key itself, or ``sha256:<64 hex digits>`` (its digest only, so the
    file can sit where a reader must not learn a key it accepts)."""
    if not value.startswith(DIGEST_PREFIX):
        return _Key(hashlib.sha256(value.encode()).digest(), value)
    hexdigest = value[len(DIGEST_PREFIX):]
    if len(hexdigest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in hexdigest):
        raise ConfigError(f"key file {source}: the key of {name!r} starts with {DIGEST_PREFIX!r} but is not "
                          "followed by 64 hex digits (a SHA-256 digest: printf %s KEY | sha256sum)")
    return _Key(bytes.fromhex(hexdigest), None)


class KeyFile(_WatchedFile[dict[str, _Key]]):
    """Named keys read from *path*, re-read when the file changes (see the module docstring). An
    entry may be a key's SHA-256 digest instead of the key (``name: sha256:<hex>``): it is accepted
    the same, and the file does not give the key away."""

    def _load(self) -> dict[str, _Key]:
        return {name: _key(name, key, self.path) for name, key in parse_keys(self._text(), self.path).items()}

    @property
    def names(self) -> list[str]:
        return sorted(self._current())

    def lookup(self, token: str) -> str | None:
        """The name of the key equal to *token*, else None (every key compared, constant time)."""
        given = hashlib.sha256(token.encode()).digest()
        found = None
        for name, key in self._current().items():
            if hmac.compare_digest(given, key.digest):
                found = name
        return found


class PresentedKeyFile(KeyFile):
    """The key file of the credential a program presents (``server.auth.key_file``): its first
    entry, which must be the key itself (a digest cannot be presented)."""

    def _load(self) -> dict[str, _Key]:
        keys = super()._load()
        name, first = next(iter(keys.items()))
        if first.plain is None:
            raise ConfigError(f"{self.what} file {self.path}: the key {name!r} is a {DIGEST_PREFIX} digest; the key "
                              "a program presents must be the key itself")
        return keys

    def first(self) -> str:
        key = next(iter(self._current().values())).plain
        assert key is not None  # _load refuses a digest in first place
        return key


class Authenticator:
    """Maps a presented key to a :class:`Principal` (None = unknown key)."""

    def __init__(self, *, management_key: str | None = None, operators: KeyFile | None = None,
                 nodes: KeyFile | None = None, inference: KeyFile | None = None) -> None:
        # its SHA-256, compared with the presented key's: equal-length, constant-time, like the files'
        self._management = hashlib.sha256(management_key.encode()).digest() if management_key else None
        self._files = {Role.OPERATOR: operators, Role.NODE: nodes, Role.INFERENCE: inference}

    @classmethod
    def from_config(cls, auth: AuthConfig, management_key: str | None,
                    inference_fallback: str | None = None) -> Authenticator:
        def kf(path: str | None, what: str) -> KeyFile | None:
            return KeyFile(path, what) if path else None

        return cls(management_key=management_key,
                   operators=kf(auth.operator_keys_file, "operator keys"),
                   nodes=kf(auth.node_keys_file, "node keys"),
                   inference=kf(auth.inference_keys_file or inference_fallback, "inference keys"))

    def requires(self, role: Role) -> bool:
        """Whether calls needing *role* must present a credential (some key grants it)."""
        if role is Role.INFERENCE:
            return self._files[Role.INFERENCE] is not None
        return self._management is not None or self._files[role] is not None

    def identify(self, token: str | None) -> Principal | None:
        if not token:
            return None
        roles: set[Role] = set()
        name = None
        for role, keys in self._files.items():
            found = keys.lookup(token) if keys is not None else None
            if found is not None:
                roles.add(role)
                name = name or found
        if self._management is not None and hmac.compare_digest(hashlib.sha256(token.encode()).digest(),
                                                                self._management):
            roles |= {Role.OPERATOR, Role.NODE}
            name = name or "management"
        return Principal(name, frozenset(roles)) if roles and name else None


class PresentedKey:
    """A credential a program presents when it calls others, taken from its file at each call:
    the file is re-read when it changes (at most every ``RELOAD_CHECK_SEC``), so rotating the key
    a program presents needs no restart either. ``str(key)`` is the current key."""

    __slots__ = ("_current",)

    def __init__(self, current: Callable[[], str]) -> None:
        self._current = current

    def __str__(self) -> str:
        return self._current()

    def __repr__(self) -> str:
        return "PresentedKey(<hidden>)"


# What a client presents: a fixed key, one re-read from its file, or none.
Credential = str | PresentedKey | None


def presented_key(auth: AuthConfig, management_key: str | None) -> Credential:
    """The credential a program presents when it calls others (``auth.key_file``, re-read when it
    changes, else the management key)."""
    if auth.key_file:
        return PresentedKey(PresentedKeyFile(auth.key_file, "auth.key_file").first)
    return management_key


class SecretFile(_WatchedFile[str]):
    """A file holding one secret (whitespace stripped, taken whole: no ``name: key`` parsing),
    re-read when it changes like a :class:`KeyFile`."""

    def _load(self) -> str:
        value = self._text().strip()
        if not value:
            raise ConfigError(f"{self.what} file {self.path} is empty")
        return value

    def current(self) -> str:
        return self._current()


MUTATION_PREFIXES = ("List", "Get", "Watch", "Check")


def is_mutation(method: str) -> bool:
    return not method.startswith(MUTATION_PREFIXES)


def audit(principal: Principal, service: str, method: str, request_id: str, code: str) -> None:
    """One line per mutation made with an operator credential."""
    audit_log.info(
        "audit: %s %s/%s request_id=%s result=%s", principal.name, service.rsplit(".", 1)[-1], method,
        request_id, code,
        extra={"audit": True, "who": principal.name, "roles": sorted(principal.roles), "service": service,
               "method": method, "request_id": request_id, "result": code},
    )
