"""Key files (named keys, strict parsing, reload on change) and the Authenticator's roles."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from motor_common import credentials
from motor_common.credentials import (
    AuthConfig,
    Authenticator,
    KeyFile,
    Role,
    parse_keys,
    presented_key,
)
from motor_common.errors import ConfigError
from motor_common.grpc_server import read_secret


def test_key_files_are_parsed_strictly() -> None:
    assert parse_keys("abcdefgh12345678\n", "f") == {"default": "abcdefgh12345678"}
    assert parse_keys("alice: op-alice-0123\nbob: op-bob-01234\n", "f") == {"alice": "op-alice-0123",
                                                                          "bob": "op-bob-01234"}
    for bad in ("", "alice: short", "two words", "[1, 2]", "{}"):
        with pytest.raises(ConfigError):
            parse_keys(bad, "f")


def _bump(path: Path) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_key_file_is_reloaded_on_change_and_keeps_old_keys_on_a_bad_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(credentials, "RELOAD_CHECK_SEC", 0.0)
    path = tmp_path / "keys.yaml"
    path.write_text("a: key-a-01234567\n")
    keys = KeyFile(str(path), "test keys")
    assert keys.lookup("key-a-01234567") == "a" and keys.lookup("key-b-01234567") is None
    path.write_text("b: key-b-01234567\n")
    _bump(path)
    assert keys.lookup("key-b-01234567") == "b" and keys.lookup("key-a-01234567") is None
    assert keys.reloads == 1
    path.write_text("")  # a half-written rotation
    _bump(path)
    assert keys.lookup("key-b-01234567") == "b"
    with pytest.raises(ConfigError, match="cannot read"):
        KeyFile(str(tmp_path / "missing"), "test keys")


def test_authenticator_grants_roles_by_key_kind(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    ops.write_text("alice: op-alice-0123\n")
    auth = Authenticator(management_key="legacy-key-012345", operators=KeyFile(str(ops), "operators"))
    alice = auth.identify("op-alice-0123")
    assert alice is not None and alice.name == "alice" and alice.roles == {Role.OPERATOR}
    legacy = auth.identify("legacy-key-012345")
    assert legacy is not None and legacy.name == "management" and legacy.roles == {Role.OPERATOR, Role.NODE}
    assert auth.identify("nope-nope-nope") is None and auth.identify("") is None
    assert auth.requires(Role.OPERATOR) and auth.requires(Role.NODE) and not auth.requires(Role.INFERENCE)
    assert not Authenticator().requires(Role.OPERATOR)


def test_a_presented_key_follows_its_file_and_keeps_the_last_good_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(credentials, "RELOAD_CHECK_SEC", 0.0)
    named, bare = tmp_path / "controller.key", tmp_path / "gateway.key"
    named.write_text("key-one-01234567\n")
    bare.write_text("  secret-one:with-colon \n")  # a single secret: taken whole, not as name: key
    auth = credentials.AuthConfig(key_file=str(named))
    presented = credentials.presented_key(auth, None)
    secret = credentials.PresentedKey(credentials.SecretFile(str(bare), "coordinator key").current)
    assert (str(presented), str(secret)) == ("key-one-01234567", "secret-one:with-colon")
    assert "key-one" not in repr(presented)
    named.write_text("key-two-01234567\n")
    bare.write_text("secret-two\n")
    _bump(named)
    _bump(bare)
    assert (str(presented), str(secret)) == ("key-two-01234567", "secret-two")
    bare.write_text("")  # a half-written rotation keeps the previous secret
    _bump(bare)
    assert str(secret) == "secret-two"
    assert credentials.presented_key(credentials.AuthConfig(), "legacy-management") == "legacy-management"


def test_a_key_file_entry_may_be_the_keys_sha256_digest(tmp_path: Path) -> None:
    key = "op-bob-0123456789"
    hexdigest = subprocess.run(["sha256sum"], input=key.encode(), capture_output=True, check=True).stdout.split()[0]
    path = tmp_path / "ops.yaml"
    path.write_text(f"bob: sha256:{hexdigest.decode().upper()}\ncarol: op-carol-0123456\n")  # as the docs say
    keys = KeyFile(str(path), "operators")
    assert keys.lookup(key) == "bob" and keys.lookup("op-carol-0123456") == "carol"
    assert keys.lookup(f"sha256:{hexdigest.decode()}") is None  # the digest is not the key
    for bad in ("sha256:abc", "sha256:" + "g" * 64):
        path.write_text(f"bob: {bad}\n")
        with pytest.raises(ConfigError, match="64 hex digits"):
            KeyFile(str(path), "operators")


def test_a_presented_key_must_be_the_key_itself(tmp_path: Path) -> None:
    path = tmp_path / "controller.key"
    path.write_text("controller: sha256:" + "ab" * 32 + "\n")
    with pytest.raises(ConfigError, match="must be the key itself"):
        presented_key(AuthConfig(key_file=str(path)), None)
    path.write_text("op-controller-0123\n")
    assert str(presented_key(AuthConfig(key_file=str(path)), None)) == "op-controller-0123"


def test_a_key_file_that_is_not_one_is_refused_in_one_sentence_without_reading_it_whole(tmp_path: Path) -> None:
    """A wrong path (/dev/zero, a large log, a binary) is a ConfigError naming the file, read at
    most 1 MiB + 1 byte: /dev/zero was read until memory ran out, a non-UTF-8 file was a
    UnicodeDecodeError traceback."""
    big = tmp_path / "engine.log"
    big.write_text("x" * (credentials.MAX_KEY_FILE_BYTES + 1))
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\xff\xfe\x00key")
    for path, said in (("/dev/zero", "is larger than 1048576 bytes"), (str(big), "is larger than 1048576 bytes"),
                       (str(binary), "is not UTF-8 text")):
        with pytest.raises(ConfigError, match=said) as err:
            read_secret(path)
        assert path in err.value.message and err.value.message.startswith("management key file")
        with pytest.raises(ConfigError, match=said):
            KeyFile(path, "operators")
    exact = tmp_path / "ops.yaml"
    exact.write_text("alice: op-alice-0123456789\n" + "#" * (credentials.MAX_KEY_FILE_BYTES - 27))
    assert KeyFile(str(exact), "operators").lookup("op-alice-0123456789") == "alice"  # at the bound: read
