"""TLS and mutual TLS for every gRPC server and client of Motor, and HTTPS for the OpenAI fronts.

One configuration shape, :class:`TlsConfig` (``cert_file``, ``key_file``, ``ca_file``,
``require_client_cert``), is a program's TLS identity:

- its gRPC server serves TLS with ``cert_file``/``key_file`` and, with ``require_client_cert``,
  refuses any client whose certificate is not signed by ``ca_file`` (mutual TLS);
- its outbound gRPC channels use TLS whenever ``ca_file`` is set (the CA that verifies the peer
  servers) and present ``cert_file``/``key_file`` as the client certificate when set;
- an HTTPS front serves ``cert_file``/``key_file`` (:func:`https_context`).

Certificates are reloaded without a restart: the gRPC server asks :class:`_CertFetcher` at every
new handshake (grpc's dynamic server credentials), the HTTPS context checks the files in its SNI
callback; both compare the files' (inode, mtime, size) and only load a pair that matches (a
half-written rotation keeps the old certificate and logs a warning). Outbound channels re-read
their client certificate the same way at each new call
(:class:`~motor_common.reloading_channel.ReloadingChannel`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509

from motor_common.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsConfig:
    """TLS identity of one program (a ``tls`` section; see the module docstring)."""

    # PEM certificate (chain) and private key of this program: served by its servers, presented
    # as the client certificate by its outbound channels.
    cert_file: str | None = None
    key_file: str | None = None
    # PEM CA bundle that verifies peers: the servers this program calls (turns on TLS for its
    # outbound channels) and, with require_client_cert, the clients that call it.
    ca_file: str | None = None
    # Mutual TLS: the server refuses a client without a certificate signed by ca_file.
    require_client_cert: bool = False

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file must be set together")
        if self.require_client_cert and not (self.ca_file and self.cert_file):
            raise ValueError(
                "tls.require_client_cert needs tls.cert_file/key_file (the server's certificate) and "
                "tls.ca_file (the CA that signs client certificates)"
            )

    @property
    def serves_tls(self) -> bool:
        """The program's servers listen with TLS."""
        return self.cert_file is not None

    @property
    def dials_tls(self) -> bool:
        """The program's outbound channels use TLS."""
        return self.ca_file is not None


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read TLS {what} file {path}: {exc.strerror}") from exc


def file_stamp(paths: list[str]) -> tuple[tuple[int, int, int], ...]:
    """(inode, mtime, size) of each file; OSError when one is missing. The inode catches a rename
    over the file (and Kubernetes' symlink swap of a mounted Secret) even when size and mtime
    happen to be equal."""
    out = []
    for p in paths:
        st = os.stat(p)
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


def _check_pair(cert_file: str, key_file: str) -> None:
    """Raise ConfigError unless *key_file* is the private key of *cert_file* (both PEM) and the
    certificate has not expired (a peer refuses an expired one: loading it over a valid one in a
    rotation would cut every new connection)."""
    pem = _read(cert_file, "certificate")
    _read(key_file, "key")
    try:
        expires = x509.load_pem_x509_certificate(pem).not_valid_after_utc
    except ValueError as exc:
        raise ConfigError(f"TLS certificate {cert_file} is not a PEM certificate: {exc}") from exc
    if expires <= dt.datetime.now(dt.UTC):
        raise ConfigError(f"TLS certificate {cert_file} expired at {expires.isoformat()}; peers would refuse it")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"TLS certificate {cert_file} and key {key_file} do not form a valid pair: {exc}"
        ) from exc


def _server_configuration(tls: TlsConfig) -> grpc.ServerCertificateConfiguration:
    assert tls.cert_file is not None and tls.key_file is not None
    _check_pair(tls.cert_file, tls.key_file)
    pair = (_read(tls.key_file, "key"), _read(tls.cert_file, "certificate"))
    ca = _read(tls.ca_file, "CA") if tls.ca_file else None
    return grpc.ssl_server_certificate_configuration([pair], root_certificates=ca)


class _CertFetcher:
    """grpc's certificate-configuration fetcher: called (on a grpc thread) at each handshake;
    returns a new configuration when the files changed, else None (keep the current one)."""

    def __init__(self, tls: TlsConfig) -> None:
        self._tls = tls
        self._paths = [p for p in (tls.cert_file, tls.key_file, tls.ca_file) if p]
        self._stamp = file_stamp(self._paths)
        self._refused: tuple[tuple[int, int, int], ...] | None = None  # files found unusable (warned once)
        self._lock = threading.Lock()
        self.reloads = 0

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            stamp: tuple[tuple[int, int, int], ...] = ()  # () = a file is missing
            try:
                stamp = file_stamp(self._paths)
                if stamp == self._stamp or stamp == self._refused:
                    return None
                config = _server_configuration(self._tls)
            except (OSError, ConfigError) as exc:
                if stamp != self._refused:  # once per state of the files, not at every handshake
                    log.warning("TLS files changed but cannot be loaded; keeping the current certificate: %s", exc)
                self._refused = stamp
                return None
            self._stamp = stamp
            self.reloads += 1
            log.info("TLS certificate reloaded", extra={"cert_file": self._tls.cert_file})
            return config


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """Credentials for ``add_secure_port``: TLS (mutual with ``require_client_cert``), reloaded
    from the files when they change. ConfigError when the files are missing or do not match."""
    if not tls.serves_tls:
        raise ConfigError("tls.cert_file and tls.key_file are needed to serve TLS")
    initial = _server_configuration(tls)
    return grpc.dynamic_ssl_server_credentials(
        initial, _CertFetcher(tls), require_client_authentication=tls.require_client_cert
    )


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """Client credentials: verify the server with ``ca_file``; present ``cert_file`` if set."""
    if not tls.ca_file:
        raise ConfigError("tls.ca_file is needed to dial TLS")
    ca = _read(tls.ca_file, "CA")
    if tls.cert_file and tls.key_file:
        _check_pair(tls.cert_file, tls.key_file)
        return grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=_read(tls.key_file, "key"),
            certificate_chain=_read(tls.cert_file, "certificate"),
        )
    return grpc.ssl_channel_credentials(root_certificates=ca)


class _HttpsContext:
    """A server SSLContext whose certificate is reloaded at a handshake after the files changed."""

    def __init__(self, tls: TlsConfig, *, optional_client_cert: bool = False) -> None:
        self._tls = tls
        self._optional = optional_client_cert
        self._paths = [p for p in (tls.cert_file, tls.key_file, tls.ca_file) if p]
        self._lock = threading.Lock()
        self.current = self._build()
        self._stamp = file_stamp(self._paths)
        self._refused: tuple[tuple[int, int, int], ...] | None = None  # files found unusable (warned once)
        self.reloads = 0
        # The outer context only dispatches: its SNI callback hands the handshake to `current`.
        self.outer = self._build()
        self.outer.sni_callback = self._on_hello

    def _build(self) -> ssl.SSLContext:
        assert self._tls.cert_file is not None and self._tls.key_file is not None
        _check_pair(self._tls.cert_file, self._tls.key_file)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self._tls.cert_file, self._tls.key_file)
        if self._tls.ca_file:
            ctx.load_verify_locations(self._tls.ca_file)
        if self._tls.require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
        elif self._optional and self._tls.ca_file:
            ctx.verify_mode = ssl.CERT_OPTIONAL  # asked for, verified when sent, not required
        return ctx

    def _on_hello(self, sslobj: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext) -> None:
        with self._lock:
            stamp: tuple[tuple[int, int, int], ...] = ()  # () = a file is missing
            try:
                stamp = file_stamp(self._paths)
                if stamp != self._stamp and stamp != self._refused:
                    self.current = self._build()
                    self._stamp = stamp
                    self.reloads += 1
                    log.info("HTTPS certificate reloaded", extra={"cert_file": self._tls.cert_file})
            except (OSError, ConfigError, ssl.SSLError) as exc:
                if stamp != self._refused:  # once per state of the files, not at every handshake
                    log.warning("TLS files changed but cannot be loaded; keeping the current certificate: %s", exc)
                self._refused = stamp
        sslobj.context = self.current


def https_context(tls: TlsConfig, *, optional_client_cert: bool = False) -> ssl.SSLContext:
    """Server SSLContext for an aiohttp site: serves ``cert_file``; with ``require_client_cert``
    only clients with a certificate signed by ``ca_file``; with *optional_client_cert* (and
    ``ca_file``) a client certificate is asked for and verified but not required (the handler
    decides, from the connection's ``peercert``); reloads the files when they change."""
    if not tls.serves_tls:
        raise ConfigError("tls.cert_file and tls.key_file are needed to serve HTTPS")
    return _HttpsContext(tls, optional_client_cert=optional_client_cert).outer
