"""``python -m calibration fit … families=[…] keep_rest=true``: refit some families into an
existing calibrated file and keep the rest of it as it is.

A new family (e.g. the non-causal attention block) can then join committed files without
refitting, and so without changing, any other block. The fitted families' parameters, errors
and tables replace theirs; everything else (provenance, other blocks and their errors, the
host block) stays. The data hash is recomputed over the union of the tables the file lists,
and the update's command line is recorded under ``assumptions``.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from analysis.inputs import fields_of, read_yaml
from calibration.config import FAMILIES
from calibration.data import Measured
from sim.errors import ConfigError

PARAM_FAMILY = {"gemm": "gemm", "attention_prefill": "attention",
                "attention_decode": "attention", "comm": "comm", "moe": "moe",
                "elementwise_eta_memory": "elementwise", "elementwise_launch_s": "elementwise",
                "attention_encoder": "encoder_attention"}


COMM_KEYS = ("comm", "allreduce", "allgather", "alltoall", "reduce_scatter", "p2p", "nccl",
             "network")


def family_of(key: str) -> str | None:
    """The fit family of an ``errors``, ``data.tables`` or ``parameters`` key, or of a note
    by its first word (None: a note about no one family)."""
    if key in PARAM_FAMILY:
        return PARAM_FAMILY[key]
    for prefix, family in (("encoder_attention", "encoder_attention"),
                           ("attention", "attention"), ("gemm", "gemm"), ("mlp", "gemm"),
                           ("moe", "moe"), ("elementwise", "elementwise"),
                           *((k, "comm") for k in COMM_KEYS)):
        if key.startswith(prefix):
            return family
    return None


def _note_family(note: str) -> str | None:
    return family_of(note.split(":")[0].split(".")[0].split(" ")[0])


def kept_families(cfg) -> set[str]:
    """The families whose blocks ``keep_rest=true`` keeps (none without it)."""
    if not cfg.keep_rest:
        return set()
    return set(FAMILIES) - set(cfg.families or FAMILIES)


def existing(out: Path, cfg) -> dict:
    """The file an update rewrites; it must exist and describe the same data folder."""
    if not Path(out).is_file():
        raise ConfigError("keep_rest", True, f"an existing calibrated file at {out}")
    what = "a calibrated file of python -m calibration fit to update (a YAML mapping)"
    doc = read_yaml(out, "out", what)
    with fields_of(out, "out", what):
        there = Path(doc["data"]["dir"]).resolve()
    here = Path(cfg.data_dir).resolve()
    if here != there:
        raise ConfigError("data_dir", cfg.data_dir, f"the data folder {out.name} was fitted on "
                          f"({there}) when keep_rest=true")
    return doc


def _files(tables: dict, root: Path) -> list[Path]:
    files = []
    for t in tables.values():
        files += [root / t["file"]] if isinstance(t, dict) else [root / f for f in t]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ConfigError("data_dir", str(root), f"the tables the file lists, to hash them "
                          f"with the new ones (missing: {missing[:3]})")
    return files


def merge(old: dict, new: dict, cfg, measured: Measured, held_out_keys: dict) -> dict:
    """``old`` with the refitted families' blocks, errors, tables and notes of ``new``."""
    refit = set(FAMILIES) - kept_families(cfg)
    keep = lambda d: {k: v for k, v in d.items() if family_of(k) not in refit}  # noqa: E731
    params = {**keep(old["parameters"]), **new["parameters"]}
    params = {k: params[k] for k in [*old["parameters"], *new["parameters"]] if k in params}
    tables = {**keep(old["data"]["tables"]),
              **{k: v for k, v in new["data"]["tables"].items() if family_of(k) in refit}}
    data = {**old["data"], "tables": tables,
            "sha256": Measured(old["data"]["format"], {}, {}, _files(tables, measured.root),
                               measured.root).sha256()}
    notes = [n for n in old["assumptions"] if _note_family(n) not in refit]
    notes += [n for n in new["assumptions"] if _note_family(n) in refit]
    notes.append(f"{', '.join(sorted(refit))}: written into this file on {date.today()} by "
                 f"`{new['command']}` (keep_rest=true: every other block as fitted above)")
    families = {family_of(k) for k in [*old["errors"], *new["errors"]]}
    old_held_out = old["held_out"].split("shape keys: ")[0]
    shape_keys = "; ".join(f"{k}: {', '.join(v)}" for k, v in held_out_keys.items()
                           if k in families)
    rest = old["held_out"].split(". Fits use")[-1]
    return {**old, "data": data,
            "held_out": f"{old_held_out}shape keys: {shape_keys}. Fits use{rest}",
            "assumptions": notes,
            "errors": {**keep(old["errors"]), **new["errors"]},
            "parameters": params}
