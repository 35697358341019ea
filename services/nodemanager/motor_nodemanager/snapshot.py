"""Container snapshot mode (``snapshot_config.enable_snapshot``): the metadata file and the
checkpoint/restore protocol.

Life of a snapshotted node:

1. *Making the snapshot.* The node starts as usual (registers, the controller sends StartEngines, the
   engines load). Once every endpoint is NORMAL the node has reached the **steady point**:
   ``GetReadiness`` answers ready with the reason ``"steady point reached ..."``; the checkpoint tool
   waits for that.
2. *Checkpoint.* The tool sends ``SIGUSR1`` to the nodemanager (:data:`CHECKPOINT_SIGNAL`) before it
   freezes the container (e.g. ``criu dump``): the heartbeat stream is closed (heartbeats paused), health
   polling and the fault reporter stop, readiness turns false ("checkpoint in progress").
3. *Restore.* After ``criu restore`` the tool sends ``SIGUSR2`` (:data:`RESTORE_SIGNAL`): the metadata is
   read again (``job_name`` replaces the configured job name), the node re-registers with the controller,
   heartbeats resume with state RESTORED, readiness is false ("restored from snapshot, waiting for a start
   command") and ``RestartEngine`` answers ABORTED until then.
4. *Start after restore.* The next StartEngines **adopts** the engines restored with the container (same
   pids, same ports; nothing is spawned). If they cannot be adopted (an engine is gone, or the command
   asks for other endpoints/ports) they are stopped and launched afresh, with a warning.

The metadata file (``snapshot_config.metadata_path``) is a JSON object whose values are strings; the only
keys are ``model_load_path``, ``job_name`` and ``namespace`` (all optional). Anything else is a
:class:`~motor_common.errors.ConfigError` at start-up. This module is pure apart from reading the file.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import orjson

from motor_common.errors import ConfigError

CHECKPOINT_SIGNAL = signal.SIGUSR1
RESTORE_SIGNAL = signal.SIGUSR2
METADATA_KEYS = ("model_load_path", "job_name", "namespace")


@dataclass(frozen=True)
class SnapshotMetadata:
    model_load_path: str = ""
    job_name: str = ""
    namespace: str = ""


def parse_metadata(raw: object, source: str = "snapshot metadata") -> SnapshotMetadata:
    """Strictly validate a decoded metadata document."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in METADATA_KEYS)
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(METADATA_KEYS)})"
        )
    bad = sorted(k for k, v in raw.items() if not isinstance(v, str))
    if bad:
        desc = ", ".join(f"{k}={raw[k]!r}" for k in bad)
        raise ConfigError(f"{source}: values must be strings: {desc}")
    return SnapshotMetadata(**raw)


def load_metadata(path: str | None) -> SnapshotMetadata:
    """Read and validate the metadata file; ConfigError when missing, unreadable or invalid."""
    if not path:
        raise ConfigError(
            "snapshot_config.metadata_path must be set when snapshot_config.enable_snapshot is on"
        )
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"snapshot metadata {path}: cannot read: {exc.strerror or exc}") from exc
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"snapshot metadata {path}: not valid JSON: {exc}") from exc
    return parse_metadata(raw, f"snapshot metadata {path}")
