"""Which program serves a `motor up` fleet's OpenAI front: pure decisions, no I/O.

- ``gateway`` (the default): ``motor-gateway`` on the front port, calling the coordinator(s)
  over gRPC. ``--ha`` (the gateway fails over between two coordinators) and ``--gateway-workers``
  (more gateway processes; the coordinator stays one) are built on it.
- ``co-located`` (``motor up --co-located``): no gateway process; the one coordinator serves the
  OpenAI front itself (its ``http`` section, docs/coordinator.md) on the port the gateway would
  have used, so the URL, ``motor status`` and ``motor down`` stay the same. Under ``--tls`` it
  serves HTTPS with the coordinator's certificate, as the gateway does with its own (clients
  verify the fleet CA; no client certificate, as on the gateway's front). ``--front-workers N``
  runs that front as N worker processes, each dispatching itself (``http.workers``).

:func:`check_topology` refuses what does not combine with a message that says what to run instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from motor_common.errors import ConfigError

GATEWAY = "gateway"
CO_LOCATED = "co-located"


@dataclass(frozen=True)
class Topology:
    co_located: bool = False

    @property
    def name(self) -> str:
        return CO_LOCATED if self.co_located else GATEWAY

    @property
    def front_program(self) -> str:
        """The program that serves the OpenAI front (the name in fleet.json's ``programs``)."""
        return "coordinator" if self.co_located else "gateway"

    @property
    def front_label(self) -> str:
        """How progress lines and port errors name the front."""
        return "OpenAI front" if self.co_located else "gateway"

    @property
    def description(self) -> str:
        if self.co_located:
            return "co-located: the coordinator serves the OpenAI front itself (no gateway process)"
        return "gateway + coordinator: the gateway serves the OpenAI front and calls the coordinator over gRPC"


def check_topology(topology: Topology, *, coordinators: int, gateway_workers: int, front_workers: int | None,
          overrides: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise ConfigError for what the topology cannot do (nothing is started yet); *front_workers*:
    ``--front-workers``, None when not given."""
    if not topology.co_located:
        if front_workers is not None:
            raise ConfigError(
                f"--front-workers {front_workers} needs --co-located: it runs the coordinator's own OpenAI "
                "front as worker processes; with the gateway (the default topology) use --gateway-workers "
                f"{front_workers} for more front processes, or add --co-located")
        gateway = overrides.get("gateway", {})
        if gateway_workers > 1 and isinstance(gateway, Mapping) and "workers" in gateway:
            raise ConfigError(
                f"gateway.workers is set twice: {gateway['workers']!r} in the fleet config and "
                f"--gateway-workers {gateway_workers}; keep one of them")
        return
    if coordinators > 1:
        raise ConfigError(
            "--co-located and --ha do not combine: with two coordinators only the gateway fails over "
            "between them (a co-located front lives and dies with its one coordinator); run "
            "`motor up --ha` for active/standby, or `motor up --co-located` without --ha")
    if gateway_workers > 1:
        raise ConfigError(
            f"--co-located and --gateway-workers {gateway_workers} do not combine: there is no gateway "
            "process (the coordinator serves the OpenAI front); use --front-workers "
            f"{gateway_workers} to run the co-located front as {gateway_workers} worker processes, or drop "
            "--co-located to run gateway workers")
    if "gateway" in overrides:
        raise ConfigError(
            "the fleet config's `gateway` section does nothing with --co-located (no gateway runs); "
            "put the front's settings under `coordinator: {http: {...}}` (limits, admission, "
            "api_key_file: docs/coordinator.md), or drop --co-located")
    http = overrides.get("coordinator", {}).get("http")
    if isinstance(http, Mapping):
        if "workers" in http and front_workers is not None:
            raise ConfigError(
                f"coordinator.http.workers is set twice: {http['workers']!r} in the fleet config and "
                f"--front-workers {front_workers}; keep one of them")
        for key, flag in (("port", "--port"), ("host", "--host")):
            if key in http:
                raise ConfigError(
                    f"coordinator.http.{key} is set by `motor up --co-located` (from {flag}); "
                    f"remove it from the fleet config and pass {flag} instead")


def front_section(host: str, port: int, https: Mapping[str, Any] | None, workers: int | None) -> dict[str, Any]:
    """The coordinator's ``http`` section that makes it serve the front on *host*:*port*
    (*https*: its ``tls`` section, certificate and key, under ``--tls``; *workers*: from
    ``--front-workers``, None to leave ``http.workers`` to the fleet config or its default)."""
    section: dict[str, Any] = {"host": host, "port": port}
    if workers is not None:
        section["workers"] = workers
    if https is not None:
        section["tls"] = dict(https)
    return section
