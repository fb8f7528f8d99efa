"""``python -m sim.explain``: the command's door; the command is ``cli.explain``."""

from cli.explain import main

if __name__ == "__main__":
    raise SystemExit(main())
