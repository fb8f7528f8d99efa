"""``python -m sim [overrides]``: run one simulation (or a sweep with ``-m``). The command's
door; the command is ``cli.app``."""

import sys

from cli.app import main
from cli.preflight import check_overrides
from sim.errors import ctrl_c_exits

if __name__ == "__main__":
    with ctrl_c_exits():
        check_overrides(sys.argv[1:])
        main()
