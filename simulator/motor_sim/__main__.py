"""``python -m motor_sim ...`` is the same as ``motor-sim ...``."""

import sys

from motor_sim.cli import main

sys.exit(main())
