"""``motor-nodemanager [--config FILE] [--ports-file PATH]``."""

from __future__ import annotations

import argparse
import os
import sys

from motor_common.runner import run
from motor_nodemanager.app import NodeManagerApp
from motor_nodemanager.config import config_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="motor-nodemanager",
        description="Motor nodemanager: registers with the controller, launches and watches engines.",
    )
    p.add_argument("--config", help="config file (USER_CONFIG_PATH, then CONFIG_PATH take precedence)")
    p.add_argument("--ports-file", help='write {"grpc": <bound port>} here (atomically) once serving')
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = config_path(args.config, os.environ)
    return run(lambda: NodeManagerApp(path, args.ports_file).run())


if __name__ == "__main__":
    sys.exit(main())
