"""``python -m calibration <command> [key=value ...]``.

- ``fit data_dir=DIR hardware=NAME backend=NAME``: fit the efficiency parameters and write
  ``sim/cost/calibrated/<hardware>/<backend>.yaml``;
- ``check data_dir=DIR hardware=NAME backend=NAME``: error of the current parameters on every
  measured row (``check.json`` and ``predictions.parquet`` in the run's output dir);
- ``validate …``: the simulator against measured serving benchmarks;
- ``from-bench results=[PATH,...] model=NAME backend=NAME``: fit the frontend and host costs
  to your own ``vllm bench serve`` result files, write a calibration file;
- ``validate-diffusion csv=PATH``: diffusion jobs against measured end-to-end latencies;
- ``fit-execution csv=PATH``: fit the eager-mode costs of a DiT step on eager/compile pairs;
- ``fit-attention-kernels csv=PATH hardware=NAME``: fit the attention kernel classes
  (FA2, FA3, …) that price a diffusion transformer's ``model.diffusion.attention_impl``;
- ``fit-attention-split csv=PATH``: fit how much of a kernel class's time is SM work (what
  carries it to a GPU of another tensor/FP32 ratio) on a second GPU's jobs;
- ``fit-vae-conv3d csv=PATH``: fit the efficiency of a video VAE's channels-first 3D
  convolutions (a CUDA-core class) on whole jobs;
- ``profile …``: measure kernels on this machine's GPU into the aiconfigurator layout.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = ("fit", "check", "validate", "from-bench", "validate-diffusion", "fit-execution",
            "fit-attention-kernels", "fit-attention-split", "fit-vae-conv3d", "profile")


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the command; its exit code (2 with one line on stderr for bad input)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, overrides = argv[0], argv[1:]
    if command in ("fit", "check"):
        from calibration.app import run_command

        return run_command(command, overrides)
    if command in COMMANDS[2:]:
        try:
            module = importlib.import_module(f"calibration.{command.replace('-', '_')}")
        except ModuleNotFoundError as e:
            if e.name != f"calibration.{command.replace('-', '_')}":
                raise
            print(f"error: command={command!r}: calibration/{command} is not installed",
                  file=sys.stderr)
            return 2
        return int(module.main(overrides) or 0)
    print(f"error: command={command!r}: one of {list(COMMANDS)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    from sim.errors import ctrl_c_exits

    with ctrl_c_exits():
        raise SystemExit(main())
