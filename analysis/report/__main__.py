"""``python -m analysis.report DIR``: the Markdown report of a run or sweep folder
(``analysis.report_md``)."""

import sys

from analysis.report_md import main
from sim.errors import ctrl_c_exits

if __name__ == "__main__":
    with ctrl_c_exits():
        sys.exit(main())
