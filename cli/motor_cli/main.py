"""``motor``: the operator CLI. Each sub-command lives in its own module.

A command module provides ``configure(parser)`` (adds its arguments) and ``run(args) -> int``;
register it with one line in :data:`COMMANDS`. Its module docstring is its ``--help`` text, so it
is written for the terminal (plain text, no markup); :data:`EPILOG` says where the docs are.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from motor_cli import output
from motor_common.version import add_version_flag

# name → (module, one-line help). One line per command.
COMMANDS: dict[str, tuple[str, str]] = {
    "register": ("motor_cli.register", "register native engines with a standalone coordinator"),
    "up": ("motor_cli.up", "run a whole fleet on this machine (simulated engines by default)"),
    "down": ("motor_cli.down", "stop the fleet started by motor up"),
    "status": ("motor_cli.status", "nodes and instances of a managed fleet, from the controller"),
    "pause": ("motor_cli.pause", "take an instance of a managed fleet out of scheduling (kept by the controller)"),
    "resume": ("motor_cli.pause", "put a paused instance of a managed fleet back into scheduling"),
}


DESCRIPTION = """Motor operator CLI: run a local Motor fleet, look at a managed one, register engines
with a standalone coordinator.

  motor up                               # a local PD fleet (simulated engines), ready for curl
  motor status                           # its nodes and instances (--json for tools)
  motor down                             # stop it (or Ctrl-C in the terminal of motor up)
  motor register list --coordinator 10.0.0.5:9100 --management-key-file key
"""
EPILOG = ("Docs: README.md and docs/ in the Motor repository (docs/standalone.md for motor register). "
          "Each command has its own --help.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="motor", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (module, help_) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_, description=importlib.import_module(module).__doc__,
                             epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        cmd.set_defaults(_module=module)
        importlib.import_module(module).configure(cmd)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Server-provided text (names, reasons, error details, log tails) never drives the terminal.
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = output.SafeText(sys.stdout), output.SafeText(sys.stderr)
    try:
        args = build_parser().parse_args(argv)
        code: int = importlib.import_module(args._module).run(args)
    finally:
        sys.stdout, sys.stderr = streams
    return code


if __name__ == "__main__":
    sys.exit(main())
