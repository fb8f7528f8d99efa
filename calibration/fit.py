"""``python -m calibration fit``: fit every family with data and write the calibrated file.

Families without data on this (hardware, backend) are carried over from ``carry_from``'s file
for the same backend, and the file says so; the all-gather's parameters stand in for p2p when
no send/receive table exists, and the bf16 GEMM's streaming efficiency and smallest-kernel
time for elementwise kernels when no elementwise table exists. A calibration without the
(optional) non-causal attention block prices it with the prefill one. ``keep_rest=true``
refits only ``families`` into the existing file and keeps everything else
(``calibration.update``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from analysis.files import write_text
from calibration import data, update, writer
from calibration.config import REPO, hardware_config
from calibration.families import FitResult, Settings, attention, comm, elementwise, gemm, moe
from calibration.families import encoder_attention as encoder
from sim.cost.operators import AttentionEfficiency, Efficiency, GemmEfficiency, gemm_time
from sim.errors import ConfigError

TINY_GEMM = 32  # n = k of the smallest GEMM in the measured tables

HELD_OUT_KEYS = {"gemm": gemm.KEYS, "attention": attention.KEYS, "comm": comm.KEYS,
                 "moe": moe.KEYS, "elementwise": elementwise.KEYS,
                 "encoder_attention": encoder.KEYS}
OPTIONAL = {"attention_encoder": "encoder_attention"}  # parameter block → its rows' family


def settings(cfg) -> Settings:
    """The fit settings of the command's config."""
    return Settings(float(cfg.held_out_fraction), int(cfg.seed), int(cfg.max_train_rows),
                    float(cfg.smoothing))


def fit_families(measured: data.Measured, hw, cfg) -> dict[str, FitResult]:
    """Each requested family's fit (families without rows are absent)."""
    s, wanted = settings(cfg), set(cfg.families or HELD_OUT_KEYS)
    f, out = measured.frames, {}
    tile = tuple(cfg.gemm_tile) if cfg.gemm_tile else (0, 0)
    steps = {"gemm": lambda: gemm.fit(f["gemm"], hw, s, tile) if "gemm" in f else None,
             "attention": lambda: attention.fit(f, hw, s),
             "comm": lambda: comm.fit(f["comm"], hw, s) if "comm" in f else None,
             "moe": lambda: moe.fit(f["moe"], hw, s) if "moe" in f else None,
             "elementwise": lambda: elementwise.fit(f.get("elementwise"), hw, s),
             "encoder_attention": lambda: encoder.fit(f.get("encoder_attention"), hw, s,
                                                      _prefill(out, cfg))}
    for name in HELD_OUT_KEYS:
        if name in wanted:
            t0 = time.perf_counter()
            r = steps[name]()
            if r is not None and r.params:
                out[name] = r
                print(f"fitted {name} in {time.perf_counter() - t0:.1f}s", flush=True)
    return out


def out_path(cfg) -> Path:
    """The calibrated file the command writes."""
    return Path(cfg.out) if cfg.out else (REPO / "sim" / "cost" / "calibrated" / cfg.hardware /
                                          f"{cfg.backend}.yaml")


def _carried_params(name: str | None, backend: str) -> dict | None:
    if not name:
        return None
    path = REPO / "sim" / "cost" / "calibrated" / name / f"{backend}.yaml"
    return yaml.safe_load(path.read_text())["parameters"] if path.is_file() else None


def _prefill(results: dict[str, FitResult], cfg) -> AttentionEfficiency | None:
    """The prefill efficiency the encoder's head-dim extrapolation leans on: this run's fit,
    else the file being written's, else ``carry_from``'s (same backend)."""
    a = results.get("attention")
    if a is not None and "attention_prefill" in a.params:
        return a.params["attention_prefill"]
    path = out_path(cfg)
    params = yaml.safe_load(path.read_text())["parameters"] if path.is_file() else None
    params = params or _carried_params(cfg.carry_from, cfg.backend) or {}
    return (AttentionEfficiency.from_dict(params["attention_prefill"])
            if "attention_prefill" in params else None)


def assemble(results: dict[str, FitResult], hw, cfg, frames: dict | None = None
             ) -> tuple[dict, list[str]]:
    """The ``parameters`` block (what ``Efficiency.from_dict`` reads) and the carry-over notes."""
    carried = _carried_params(cfg.carry_from, cfg.backend)
    notes: list[str] = []
    params: dict = {}
    frames = frames or {}
    kept = update.kept_families(cfg)  # keep_rest=true: these blocks stay as the file has them

    def take(key: str, fitted, why: str):
        if update.PARAM_FAMILY[key] in kept:
            return
        had_rows = (OPTIONAL[key] in frames if key in OPTIONAL else
                    key.split("_")[0] in {f.split("_")[0] for f in frames if f not in
                                          OPTIONAL.values()})
        if fitted is None and had_rows:
            why = f"its rows were not fitted in this run (families={list(cfg.families or [])})"
        if fitted is not None:
            params[key] = fitted
        elif carried is not None and key in carried:
            params[key] = carried[key]
            notes.append(f"{key}: carried over from {cfg.carry_from}/{cfg.backend} ({why})")
        elif key in OPTIONAL:
            notes.append(f"{key}: none ({why}, nothing to carry it from); the simulator "
                         "prices it with attention_prefill")
        else:
            raise ConfigError("carry_from", cfg.carry_from, f"{key} has no data here ({why}) "
                              "and nothing to carry it from")

    g = results.get("gemm")
    take("gemm", {k: v.to_dict() for k, v in g.params.items()} if g else None, "no GEMM table")
    a = results.get("attention", FitResult())
    for fam in ("attention_prefill", "attention_decode"):
        take(fam, a.params[fam].to_dict() if fam in a.params else None, f"no {fam} table")
    c = results.get("comm")
    comm_params = {k: v.to_dict() for k, v in c.params.items()} if c else {}
    if comm_params and "allreduce" not in comm_params and carried:
        comm_params["allreduce"] = carried["comm"]["allreduce"]
        notes.append(f"comm.allreduce: carried over from {cfg.carry_from}/{cfg.backend}")
    for kind, stand_in in (("allgather", "allreduce"), ("alltoall", "allgather"),
                           ("p2p", "allgather")):
        if comm_params and kind not in comm_params:
            src = stand_in if stand_in in comm_params else "allreduce"
            comm_params[kind] = comm_params[src]
            notes.append(f"comm.{kind}: no table; uses the {src} parameters")
    take("comm", comm_params or None, "no collective table")
    m = results.get("moe")
    moe_params = {k: v.to_dict() for k, v in m.params.items()} if m else None
    if moe_params and "fp8" not in moe_params and "fp8_block" in moe_params:
        moe_params["fp8"] = moe_params["fp8_block"]
        notes.append("moe.fp8: no per-tensor FP8 MoE table; uses the fp8_block parameters")
    take("moe", moe_params, "no MoE table")
    enc = results.get("encoder_attention", FitResult()).params.get("attention_encoder")
    take("attention_encoder", enc.to_dict() if enc else None, "no encoder_attention table")
    e = results.get("elementwise")
    if e is not None:
        params.update(e.params)
    elif "elementwise" not in kept:
        gemm_params = params.get("gemm") or update.existing(out_path(cfg), cfg)["parameters"][
            "gemm"]  # keep_rest=true of elementwise alone: the file's GEMM
        bf16 = GemmEfficiency.from_dict(gemm_params["bfloat16"])
        num_sms = int(hw.num_sms)
        params["elementwise_eta_memory"] = float(f"{float(bf16.memory_eta(1, 8192, 8192)):.5g}")
        # a kernel's fixed cost: the time of the smallest GEMM measured, which moves next to
        # nothing (the launch intercept alone shifts with how the tables take small shapes)
        tiny = gemm_time(bf16, 1, TINY_GEMM, TINY_GEMM, float(hw.bf16_flops),
                              float(hw.hbm_bandwidth), 2.0, num_sms=num_sms)[0]
        params["elementwise_launch_s"] = float(f"{float(tiny):.5g}")
        notes.append("elementwise: no table; streaming efficiency of the bf16 GEMM at m=1, "
                     f"n=k=8192 (a weight read) and its time at m=1, n=k={TINY_GEMM} (a kernel "
                     "that moves next to nothing) as the launch latency")
    return params, notes


def run(cfg, outdir: Path, command_line: str) -> dict:
    """Fit, write the calibrated file and ``fit.json``; returns the error summary."""
    t0 = time.perf_counter()
    hw = hardware_config(cfg.hardware)
    measured = data.read(cfg)
    print(f"read {sum(len(v) for v in measured.frames.values())} rows "
          f"({measured.format}) in {time.perf_counter() - t0:.1f}s", flush=True)
    results = fit_families(measured, hw, cfg)
    if not results and not cfg.keep_rest:
        raise ConfigError("families", list(cfg.families or []), "no family had data to fit")
    params, notes = assemble(results, hw, cfg, measured.frames)
    errors = {k: v for r in results.values() for k, v in r.errors.items()}
    notes += [n for r in results.values() for n in r.notes] + list(cfg.notes or [])
    out = out_path(cfg)
    doc = writer.document(cfg, measured, params, errors, notes, command_line,
                          {k: HELD_OUT_KEYS[k] for k in results})
    if cfg.keep_rest:
        doc = update.merge(update.existing(out, cfg), doc, cfg, measured, HELD_OUT_KEYS)
        errors = doc["errors"]
    Efficiency.from_dict(doc["parameters"])  # the simulator can load what is written
    writer.write(doc, out)
    print(writer.error_table(errors))
    print(f"wrote {out} in {time.perf_counter() - t0:.1f}s")
    summary = {"out": str(out), "errors": errors, "notes": notes,
               "seconds": round(time.perf_counter() - t0, 1)}
    write_text(outdir / "fit.json", json.dumps(summary, indent=2))
    return summary

