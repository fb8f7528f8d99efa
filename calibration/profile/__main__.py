"""``python -m calibration.profile key=value ...``: the profiler without the dispatcher."""

import sys

from calibration.profile import main

raise SystemExit(main(sys.argv[1:]))
