"""Host-overhead fit: exact linearity, step profiles under an overlap scheduler, recovery of
known values, the split, the YAML write."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from calibration import host_fit
from calibration.silicon_replay import RowSimulator
from calibration.silicon_rows import plan_rows


def row(**kw) -> dict:
    """A Llama-3.1-8B vLLM agg row of the silicon_sample layout."""
    return {"id": "r", "backend": "vllm", "model_path": "meta-llama/Llama-3.1-8B-Instruct",
            "system": "h100_sxm", "mode": "agg", "isl": 64, "osl": 8, "batch_size": 2.0,
            "tp_size": 1.0, "silicon_ttft_ms": 20.0, "silicon_tpot_ms": 5.0} | kw


ZERO = (0.0, 0.0, 0.0, 0.0)


def synthetic(h: tuple[float, ...], n: int = 12, seed: int = 0) -> pd.DataFrame:
    """Rows simulated at host (0, 0) whose measurements come from a known host ``h``."""
    rng = np.random.default_rng(seed)
    t = pd.DataFrame({
        "id": [f"r{i}" for i in range(n)], "backend": "vllm", "model": "m",
        "isl": rng.choice([128, 1024, 4096], n), "osl": 128, "tp": rng.choice([1, 2], n),
        "pred_ttft_ms": rng.uniform(20, 200, n), "pred_tpot_ms": rng.uniform(5, 30, n),
        "ttft_steps": rng.uniform(1, 5, n), "ttft_seq_steps": rng.uniform(5, 300, n),
        "ttft_new_steps": rng.uniform(1, 64, n), "ttft_token_steps": rng.uniform(100, 9000, n),
        "tpot_steps": rng.uniform(0.9, 1.3, n), "tpot_seq_steps": rng.uniform(2, 100, n),
        "tpot_new_steps": rng.uniform(0, 2, n), "tpot_token_steps": rng.uniform(2, 400, n)})
    meas = host_fit.linear_predictions(t, ZERO, h)
    return t.assign(meas_ttft_ms=meas["ttft"], meas_tpot_ms=meas["tpot"])


def test_fit_recovers_known_host_values():
    truth = (1.5, 40.0, 250.0, 0.8)
    fitted = host_fit.fit_host(synthetic(truth, n=24), ZERO)
    assert np.allclose(fitted, truth, rtol=1e-3)


def test_fit_keeps_the_keys_it_does_not_fit():
    truth = (1.5, 40.0, 0.0, 0.0)
    fitted = host_fit.fit_host(synthetic(truth), (0.0, 0.0, 7.0, 0.5),
                               free=("overhead_ms", "per_seq_us"))
    assert fitted[2:] == (7.0, 0.5)


def test_held_out_keeps_whole_groups():
    t = synthetic((1.0, 1.0, 1.0, 1.0), n=40)
    mask = host_fit.held_out(t, 0.3, seed=0)
    assert 0 < mask.sum() < len(t)
    keys = t[host_fit.GROUP].astype(str).agg("|".join, axis=1)
    assert set(keys[mask]).isdisjoint(set(keys[~mask]))
    assert (mask == host_fit.held_out(t, 0.3, seed=0)).all()


def test_step_counts_make_predictions_exactly_linear():
    plan = plan_rows(pd.DataFrame([row(batch_size=3.0, isl=96, osl=6)]),
                     "h100_sxm").iloc[0].to_dict()
    # the engine alone: a frontend's streaming queue makes the clients' times depend on the
    # steps' durations
    plan["overrides"] = [*plan["overrides"], *(f"backend.frontend.{k}=0" for k in (
        "per_request_ms", "per_prompt_token_us", "per_output_token_us", "latency_ms"))]
    with RowSimulator(3, harness="burst") as s:  # started together, the schedule is duration-free
        r0 = s.run(s.compose(plan), ZERO)
        r1 = s.run(s.compose(plan), (2.0, 30.0, 400.0, 3.0))
    lin = host_fit.linear_predictions(pd.DataFrame([r0]), ZERO, (2.0, 30.0, 400.0, 3.0))
    for m in ("ttft", "tpot"):
        assert r1[f"pred_{m}_ms"] > r0[f"pred_{m}_ms"]
        assert np.isclose(lin[m][0], r1[f"pred_{m}_ms"], rtol=1e-9)


def test_rows_under_an_overlap_scheduler_without_a_step_profile_are_not_fitted():
    """A step under an overlap scheduler takes max(GPU, host): such rows (SGLang's and
    TensorRT-LLM's by default) enter the fit only through their step profiles, and a backend
    with no usable row keeps its calibrated values."""
    truth = (1.5, 40.0, 250.0, 0.8)
    t = synthetic(truth, n=24).assign(mode="agg", host_adds=True)
    t = pd.concat([t, t.assign(backend="sglang", host_adds=False)], ignore_index=True)
    fits, skipped = host_fit.fit_backends(t, {"vllm": ZERO, "sglang": ZERO}, 0.3, seed=0)
    assert set(fits) == {"vllm"}
    assert np.allclose(host_fit.coefficients(fits["vllm"]), truth, rtol=1e-3)
    assert set(skipped) == {"sglang"} and "step profile" in skipped["sglang"]
    with pytest.raises(ValueError, match="no step profile"):
        host_fit.predictions(t, ZERO, truth)


def overlapped(h: tuple[float, ...], n: int = 16, seed: int = 1, launch_ms: float = 3.0):
    """Rows of an overlap scheduler, simulated at host 0, whose measurements come from a known
    host ``h``: each has decode steps of a few GPU times (some shorter than the host's time)
    and one prefill step of ``launch_ms`` of kernel launches."""
    rng = np.random.default_rng(seed)
    t = synthetic(ZERO, n=n, seed=seed).assign(backend="trtllm", mode="agg", host_adds=False)
    profiles = {}
    for rid in t["id"]:
        k = 6
        seqs = rng.choice([4, 16, 64, 128], k).astype(float)
        profiles[rid] = pd.DataFrame({
            "steps": 1.0, "seq_steps": seqs, "new_steps": np.r_[1.0, np.zeros(k - 1)],
            "token_steps": seqs + np.r_[1000.0, np.zeros(k - 1)],
            "gpu_ms": rng.uniform(1.0, 9.0, k), "launch_ms": np.r_[launch_ms, np.zeros(k - 1)],
            "host_ms": 0.0, "w_ttft": rng.uniform(0.5, 3.0, k), "w_tpot": rng.uniform(0, 0.2, k)})
    for p in profiles.values():  # what the simulation at host 0 showed: the launches' excess
        p["host_ms"] = np.maximum(p["launch_ms"] - p["gpu_ms"], 0.0)
    meas = host_fit.predictions(t, ZERO, h, profiles)
    return t.assign(meas_ttft_ms=meas["ttft"], meas_tpot_ms=meas["tpot"]), profiles


def test_fit_recovers_host_values_that_show_only_above_the_gpu_time():
    truth = (2.5, 50.0, 0.0, 0.0)
    t, profiles = overlapped(truth)
    fitted = host_fit.fit_host(t, ZERO, free=("overhead_ms", "per_seq_us"), profiles=profiles)
    assert np.allclose(fitted, truth, rtol=1e-3, atol=1e-6)


def test_fit_finds_host_values_from_a_start_where_they_hide_everywhere():
    """Without launches, host time at the start (0) hides under every step: no gradient."""
    truth = (2.5, 50.0, 0.0, 0.0)
    t, profiles = overlapped(truth, launch_ms=0.0)
    fitted = host_fit.fit_host(t, ZERO, free=("overhead_ms", "per_seq_us"), profiles=profiles)
    assert np.allclose(fitted, truth, rtol=1e-3, atol=1e-6)


def test_hidden_host_values_are_not_fitted():
    """Host time below every step's GPU time: no start does better than the current values,
    so the backend keeps them (and says why)."""
    t, profiles = overlapped(ZERO, launch_ms=0.0)
    assert host_fit.fit_host(t, (0.2, 1.0, 0.0, 0.0), profiles=profiles) is None
    fits, skipped = host_fit.fit_backends(t, {"trtllm": (0.2, 1.0, 0.0, 0.0)}, 0.3, seed=0,
                                          profiles=profiles)
    assert fits == {} and "kept" in skipped["trtllm"]


@pytest.mark.parametrize("h1", [(10.0, 60.0, 0.0, 0.0), (0.5, 5.0, 3000.0, 20.0),
                                (8.0, 0.0, 0.0, 0.0)])
def test_a_step_profile_predicts_the_overlapped_simulation(h1):
    """A TensorRT-LLM row (overlap scheduler; its decode steps replay graphs, its prompt steps
    launch their kernels): the profile simulated at one host value predicts the simulation at
    another."""
    plan = plan_rows(pd.DataFrame([row(backend="trtllm", batch_size=4.0, isl=96, osl=12)]),
                     "h100_sxm").iloc[0].to_dict()
    plan["overrides"] = [*plan["overrides"], *(f"backend.frontend.{k}=0" for k in (
        "per_request_ms", "per_prompt_token_us", "per_output_token_us", "latency_ms"))]
    h0 = ZERO
    with RowSimulator(3, harness="burst") as s:
        r0 = s.run(s.compose(plan), h0, profile=True)
        r1 = s.run(s.compose(plan), h1)
    assert not r0["host_adds"]
    rows = pd.DataFrame([r0 | {"id": "r"}]).drop(columns="step_profile")
    pred = host_fit.predictions(rows, h0, h1, {"r": r0["step_profile"]})
    assert r1["pred_tpot_ms"] > 1.02 * r0["pred_tpot_ms"] or \
        r1["pred_ttft_ms"] > 1.02 * r0["pred_ttft_ms"]  # the host time shows somewhere
    for m in ("ttft", "tpot"):
        assert np.isclose(pred[m][0], r1[f"pred_{m}_ms"], rtol=1e-3)


def test_the_row_simulator_says_whether_host_time_adds():
    plans = plan_rows(pd.DataFrame([row(), row(id="s", backend="sglang",
                                            model_path="Qwen/Qwen3-8B")]), "h100_sxm")
    with RowSimulator(1, harness="burst") as s:
        vllm, sglang = (s.run(s.compose(p)) for p in plans.to_dict("records"))
    assert vllm["host_adds"] and not sglang["host_adds"]


def test_write_host_replaces_only_the_host_block(tmp_path):
    path = tmp_path / "vllm.yaml"
    path.write_text("hardware: h100_sxm\nparameters:\n  a: 1\n  b: [1, 2]\n"
                    "host:\n  overhead_ms: 0.5\n  per_seq_us: 2.0\n  fitted: false\n"
                    "errors:\n  x: 3\n")
    f = {"overhead_ms": 0.8, "per_seq_us": 5.0, "per_new_request_us": 90.0, "per_token_us": 0.2,
         "train_ids": ["a"], "held_out_ids": ["b"],
         "model": {"train": {}, "held_out": {}}}
    host_fit.write_host(path, host_fit.host_block(f, 0.3, 0, "s.csv"))
    doc = yaml.safe_load(path.read_text())
    assert doc["host"]["overhead_ms"] == 0.8 and doc["host"]["fitted"] is True
    assert doc["host"]["rows"] == {"train": 1, "held_out": 1}
    assert doc["parameters"] == {"a": 1, "b": [1, 2]} and doc["errors"] == {"x": 3}
    assert path.read_text().startswith("hardware: h100_sxm\nparameters:\n  a: 1\n")
