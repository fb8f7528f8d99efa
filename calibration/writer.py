"""The calibrated file ``sim/cost/calibrated/<hardware>/<backend>.yaml``: provenance, errors,
parameters, and the host block (owned by the end-to-end validation; kept as it is)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import yaml

from analysis.files import write_text
from analysis.inputs import fields_of, read_yaml
from calibration.data import Measured

NEW_HOST = {"overhead_ms": 0.5, "per_seq_us": 2.0, "fitted": False, "note": "not fitted yet"}
FORM = ("time = max(flops / (peak_flops * eta_compute), bytes / (peak_bw * eta_memory)) + fixed "
        "costs; each eta = scale x smooth tables over one or two shape variables (linear in "
        "log2 of the variables and log of the factor; sim/cost/operators.py)")


class _Dumper(yaml.SafeDumper):
    """Block style for mappings, one flow-style line per table row (short, diffable files)."""


def _represent_list(dumper, data):
    flat = all(isinstance(x, (int, float)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _represent_list)


def document(cfg, measured: Measured, params: dict, errors: dict, notes: list[str],
             command_line: str, held_out_keys: dict) -> dict:
    """Everything the file records, in reading order (host added by ``write``)."""
    return {
        "hardware": cfg.hardware,
        "backend": cfg.backend,
        "fitted_on": str(date.today()),
        "command": command_line,
        "data": {"format": measured.format, "dir": str(cfg.data_dir),
                 "sha256": measured.sha256(), "tables": measured.tables},
        "held_out": (f"{cfg.held_out_fraction:.0%} of the distinct shapes of each family held "
                     f"out of its fit (seed {cfg.seed}); shape keys: "
                     + "; ".join(f"{k}: {', '.join(v)}" for k, v in held_out_keys.items())
                     + f". Fits use at most {cfg.max_train_rows} of the other rows."),
        "form": FORM,
        "assumptions": notes,
        "errors": errors,
        "parameters": params,
    }


def write(doc: dict, out: Path) -> None:
    """Write ``doc`` to ``out``, keeping the existing file's ``host`` block (or a default)."""
    out = Path(out)
    host = NEW_HOST
    if out.is_file():
        what = "a calibrated file to rewrite (a YAML mapping)"
        old = read_yaml(out, "out", what)
        with fields_of(out, "out", what):
            host = old.get("host") or NEW_HOST
    out.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump({**doc, "host": host}, Dumper=_Dumper, sort_keys=False, width=100,
                     allow_unicode=True)
    write_text(out, text)


def error_table(errors: dict) -> str:
    """Train and held-out absolute % errors per family, one line each."""
    lines = [f"{'family':28s} {'train n':>8s} {'median':>7s} {'p90':>7s} | {'held-out n':>10s} "
             f"{'median':>7s} {'p90':>7s}"]
    for name, e in errors.items():
        tr, ho = e["train"], e["held_out"]
        lines.append(f"{name:28s} {tr['rows']:8d} {_pct(tr['median_ape_pct'])} "
                     f"{_pct(tr['p90_ape_pct'])} | {ho['rows']:10d} "
                     f"{_pct(ho['median_ape_pct'])} {_pct(ho['p90_ape_pct'])}")
    return "\n".join(lines)


def _pct(v) -> str:
    return f"{'—':>6s}%" if v is None else f"{v:6.2f}%"
