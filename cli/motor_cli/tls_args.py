"""``--tls-*`` flags shared by the CLI commands that call a gRPC API (``motor status``,
``motor register``): the CA that verifies the server and, for mutual TLS, this client's
certificate and key. Environment: ``MOTOR_TLS_CA_FILE``, ``MOTOR_TLS_CERT_FILE``,
``MOTOR_TLS_KEY_FILE``; a fleet started by ``motor up --tls`` records them in its fleet.json."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from motor_common.errors import ConfigError
from motor_common.tls import TlsConfig


def add_tls_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-ca-file", default=os.environ.get("MOTOR_TLS_CA_FILE"), metavar="F",
                   help="CA bundle verifying the server: turns TLS on (env MOTOR_TLS_CA_FILE)")
    p.add_argument("--tls-cert-file", default=os.environ.get("MOTOR_TLS_CERT_FILE"), metavar="F",
                   help="client certificate for mutual TLS (env MOTOR_TLS_CERT_FILE)")
    p.add_argument("--tls-key-file", default=os.environ.get("MOTOR_TLS_KEY_FILE"), metavar="F",
                   help="client private key for mutual TLS (env MOTOR_TLS_KEY_FILE)")


def tls_from_args(args: argparse.Namespace, fleet: Mapping[str, Any] | None = None) -> TlsConfig | None:
    """The TLS settings of the flags, else of a ``motor up`` fleet file; None = plaintext."""
    recorded: Mapping[str, Any] = (fleet or {}).get("tls") or {}
    ca = args.tls_ca_file or recorded.get("ca_file")
    cert = args.tls_cert_file or recorded.get("cert_file")
    key = args.tls_key_file or recorded.get("key_file")
    if not (ca or cert or key):
        return None
    if not ca:
        raise ConfigError("--tls-cert-file/--tls-key-file need --tls-ca-file (the CA that verifies the server)")
    try:
        return TlsConfig(cert_file=cert, key_file=key, ca_file=ca)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("tls.cert_file", "--tls-cert-file").replace("tls.key_file", "--tls-key-file")) from exc
