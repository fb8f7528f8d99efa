"""``python -m sim [overrides]``: run one simulation (or a sweep with ``-m``)."""

import sys

from sim.app import main
from sim.errors import ctrl_c_exits
from sim.preflight import check_overrides

if __name__ == "__main__":
    with ctrl_c_exits():
        check_overrides(sys.argv[1:])
        main()
