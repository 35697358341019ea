"""motor down: stop the fleet started by motor up (the same as Ctrl-C in its terminal).

  motor down                          # the fleet in ./.motor/up
  motor down --state-dir /srv/motor   # the fleet started with motor up --state-dir /srv/motor

Waits until motor up has stopped every program (--timeout); a motor up still starting is stopped
too. Exits 1 when no fleet runs there.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from motor_cli import arg_types, statedir, target


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=target.DEFAULT_STATE_DIR, help="state dir of motor up (default %(default)s)")
    parser.add_argument("--timeout", type=arg_types.seconds(), default=30.0, help="seconds to wait for it to stop")


def run(args: argparse.Namespace) -> int:
    fleet = target.running_fleet(args.state_dir)
    if fleet is not None and fleet.alive:
        pid = fleet.pid
    else:
        # A motor up that is still starting holds the state dir's lock before it writes fleet.json.
        starting = statedir.lock_holder(Path(args.state_dir))
        if starting is None:
            print(f"error: nothing to stop: {target.no_fleet_message(args.state_dir, '--state-dir DIR')}",
                  file=sys.stderr)
            if fleet is not None:  # left by a motor up that was killed: it describes nothing
                fleet.path.unlink(missing_ok=True)
            return 1
        if not starting:
            print(f"error: a motor up is just starting in {args.state_dir}; run motor down again",
                  file=sys.stderr)
            return 1
        pid = starting
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"error: nothing to stop: motor up (pid {pid}) has just exited", file=sys.stderr)
        return 1
    except PermissionError:
        print(f"error: motor up (pid {pid}) belongs to another user: run motor down as that user", file=sys.stderr)
        return 1
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if not target.pid_alive(pid):
            print("stopped")
            return 0
        time.sleep(0.2)
    print(f"motor up (pid {pid}) did not stop within {args.timeout:g} s", file=sys.stderr)
    return 1
