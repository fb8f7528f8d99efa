"""Former name of ``python -m calibration validate`` (kept so old commands keep working):
``python -m calibration.validate_silicon key=value ...`` runs ``calibration.validate.main``."""

from __future__ import annotations

import sys

from calibration.validate import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
