"""The command line: the Hydra entry points that wire config -> scenario -> simulate ->
analysis -> files (``python -m sim``, ``python -m sim.explain``) and what every command shares
(composing ``conf/`` with one-line errors, hints, the checks before a run, the unused-settings
warnings, the run folder). Nothing below this package imports it."""
