"""motor down: stop the fleet started by motor up (the same as Ctrl-C in its terminal).

  motor down                          # the fleet in ./.motor/up
  motor down --state-dir /srv/motor   # the fleet started with motor up --state-dir /srv/motor

Waits until motor up has stopped every program (--timeout). Exits 1 when no fleet runs there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=".motor/up", help="state dir of `motor up` (default .motor/up)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for it to stop")


def run(args: argparse.Namespace) -> int:
    fleet_file = Path(args.state_dir) / "fleet.json"
    try:
        pid = int(json.loads(fleet_file.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        print(f"no running fleet found ({fleet_file} missing or unreadable)", file=sys.stderr)
        return 1
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"motor up (pid {pid}) is not running; removing {fleet_file}")
        fleet_file.unlink(missing_ok=True)
        return 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("stopped")
            return 0
        time.sleep(0.2)
    print(f"motor up (pid {pid}) did not stop within {args.timeout:g} s", file=sys.stderr)
    return 1
