"""``motor-nodemanager [--config FILE] [--ports-file PATH]``."""

from __future__ import annotations

import argparse
import os
import sys

from motor_common.runner import DOCS_HINT, check_config, run
from motor_common.version import add_version_flag
from motor_nodemanager.app import NodeManagerApp
from motor_nodemanager.config import ENV_PREFIX, config_path, load

HELP = """Motor nodemanager: one per node. Registers the node with the controller, launches its
engines (vLLM, SGLang or motor-sim) as process groups, polls their health and streams heartbeats.

  motor-nodemanager --config node.yaml
  motor-nodemanager --config node.yaml --port 9301 --check-config
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="motor-nodemanager", description=HELP,
                                epilog="Config keys: docs/nodemanager.md. " + DOCS_HINT,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_flag(p)
    p.add_argument("--config", help="config file (USER_CONFIG_PATH, then CONFIG_PATH take precedence)")
    p.add_argument("--port", type=int, help="gRPC port (overrides server.port; same as "
                   "MOTOR_NODEMANAGER__SERVER__PORT)")
    p.add_argument("--ports-file", help='write {"grpc": <bound port>} here (atomically) once serving')
    p.add_argument("--check-config", action="store_true",
                   help="validate the configuration and exit (0 valid, 2 invalid); starts nothing")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.port is not None:  # an env override, so a config reload keeps it
        os.environ[f"{ENV_PREFIX}__SERVER__PORT"] = str(args.port)
    path = config_path(args.config, os.environ)
    if args.check_config:
        return check_config(lambda: load(path))
    return run(lambda: NodeManagerApp(path, args.ports_file).run())


if __name__ == "__main__":
    sys.exit(main())
