"""What the plots say about themselves: a run's latency ECDFs name what was run and mark its
SLO bounds, the Pareto plot labels its points with their request rates, and the node
occupancy of a large diffusion pool stays readable. The figures are inspected, not images."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from omegaconf import OmegaConf

import analysis.compare_plots
import analysis.diffusion_plots
import analysis.plots
from analysis.compare_plots import plot_pareto
from analysis.diffusion_plots import node_occupancy_figure, write_diffusion_plots
from analysis.plots import write_plots
from sim.diffusion.records import DiffusionRecords
from sim.records import LogHistogram, Records


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot modules hand to ``save_figure``, in order, instead of files."""
    figures = []
    for module in (analysis.plots, analysis.diffusion_plots, analysis.compare_plots):
        monkeypatch.setattr(module, "save_figure", lambda fig, path, **_: figures.append(fig))
    return figures


def llm_config(**workload):
    """The fields of a saved ``python -m sim`` config that the titles and bounds read."""
    return OmegaConf.create({
        "model": {"name": "llama3_8b"}, "hardware": {"name": "h100_sxm"},
        "scheduler": {"name": "vllm"},
        "workload": {"kind": "llm", "arrival": "poisson", "rate": 5.0, "concurrency": 8,
                     **workload},
        "slo": {"name": "chat", "ttft_ms": 500.0, "tpot_ms": 50.0, "e2el_ms": None}})


def save_config(cfg, outdir) -> None:
    """``cfg`` where Hydra saves a run's config."""
    (outdir / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, outdir / ".hydra" / "config.yaml")


def llm_records(n: int = 200) -> Records:
    """``n`` completed requests, TTFT 50-800 ms, 2-101 output tokens; step totals only (so
    ``write_plots`` draws the latency ECDFs alone)."""
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 60, n))
    ttft = rng.uniform(0.05, 0.8, n)
    out = rng.integers(2, 102, n)
    requests = pd.DataFrame({
        "request_id": np.arange(n), "arrival_s": arrival, "first_token_s": arrival + ttft,
        "completion_s": arrival + ttft + (out - 1) * rng.uniform(0.01, 0.06, n),
        "generated_tokens": out, "status": "completed"})
    return Records(requests, pd.DataFrame({"kind": pd.Series([], dtype=int)}),
                   LogHistogram(), {"step_totals": []})


def bound_lines(ax) -> list[float]:
    """The x of each vertical line on ``ax``."""
    return [float(x[0]) for x in (line.get_xdata() for line in ax.get_lines())
            if len(x) == 2 and x[0] == x[1]]


def test_latency_ecdfs_are_titled_with_the_run_and_mark_each_set_slo_bound(tmp_path, drawn):
    save_config(llm_config(), tmp_path)
    write_plots(llm_records(), tmp_path)
    fig = drawn[0]
    assert fig._suptitle.get_text() == "llama3_8b on h100_sxm, scheduler=vllm, 5.0 req/s"
    ttft, tpot, e2e = fig.axes
    assert "E2E" in e2e.get_xlabel()
    assert bound_lines(ttft) == [500.0] and bound_lines(tpot) == [50.0]
    assert bound_lines(e2e) == []  # e2el_ms unset: no line
    assert any("500 ms" in t.get_text() for t in ttft.texts)
    assert any("50 ms" in t.get_text() for t in tpot.texts)
    assert not e2e.texts


def test_an_e2e_bound_and_a_closed_loop_run(tmp_path, drawn):
    cfg = llm_config(arrival="closed_loop", concurrency=64)
    cfg.slo = {"name": "e2e", "ttft_ms": None, "tpot_ms": None, "e2el_ms": 4000.0}
    write_plots(llm_records(), tmp_path, cfg)
    fig = drawn[0]
    assert fig._suptitle.get_text() == "llama3_8b on h100_sxm, scheduler=vllm, concurrency=64"
    ttft, tpot, e2e = fig.axes
    assert bound_lines(ttft) == bound_lines(tpot) == [] and bound_lines(e2e) == [4000.0]
    lo, hi = e2e.get_xlim()
    assert lo < 4000 < hi
    assert [t.get_text().strip() for t in e2e.texts] == ["SLO 4000 ms"]


def test_without_a_saved_config_the_ecdfs_are_drawn_untitled(tmp_path, drawn):
    write_plots(llm_records(), tmp_path)
    fig = drawn[0]
    assert fig._suptitle is None and len(fig.axes) == 3
    assert all(bound_lines(ax) == [] for ax in fig.axes)


def diffusion_records(nodes: int, jobs: int = 60) -> DiffusionRecords:
    """``jobs`` FLUX.1-dev jobs under fcfs on ``nodes`` nodes, all busy from 10 s, node 3
    down from 20 s to 60 s."""
    rng = np.random.default_rng(1)
    arrival = np.sort(rng.uniform(0, 100, jobs))
    service = rng.uniform(1, 20, jobs)
    table = pd.DataFrame({"job_id": np.arange(jobs), "model": "flux1_dev",
                          "status": "completed", "arrival_s": arrival, "start_s": arrival,
                          "completion_s": arrival + service, "service_s": service,
                          "step_s": 0.1})
    rows = [(0.0, n, 0, 0, True) for n in range(nodes)]
    rows += [(10.0, n, 8, 1, True) for n in range(nodes)]
    rows += [(20.0, 3, 0, 0, False), (60.0, 3, 0, 0, True)]
    occupancy = pd.DataFrame(rows, columns=["time_s", "node", "busy_gpus", "running_jobs",
                                            "up"]).sort_values(["time_s", "node"])
    meta = {"num_nodes": nodes, "gpus_per_node": 8, "policy": "fcfs", "elastic": False,
            "sim_time_s": 100.0, "node_failures": [{"node": 3, "down_s": 20.0, "up_s": 60.0}]}
    return DiffusionRecords(table, occupancy.reset_index(drop=True), meta)


def test_diffusion_job_ecdfs_name_pipeline_gpu_policy_and_rate(tmp_path, drawn):
    save_config(OmegaConf.create({
        "model": {"name": "flux1_dev"}, "hardware": {"name": "h100_sxm"},
        "cluster": {"policy": "fcfs"},
        "workload": {"kind": "diffusion", "arrival": "poisson", "rate": 0.8}}), tmp_path)
    write_diffusion_plots(diffusion_records(nodes=2), tmp_path)
    assert drawn[0]._suptitle.get_text() == "flux1_dev on h100_sxm, policy=fcfs, 0.8 jobs/s"


def pareto_jobs() -> pd.DataFrame:
    """Two designs at three rates, two seeds each, in the columns ``plot_pareto`` reads."""
    rows = []
    for d, design in enumerate(("vllm", "sarathi")):
        for rate in (2.0, 4.0, 8.0):
            for seed in (0, 1):
                rows.append({"label": design, "rate": rate, "seed": seed,
                             "steady.median_tps": 100 / rate + d + seed,
                             "steady.output_throughput_per_gpu": 300 * rate + 10 * d})
    return pd.DataFrame(rows)


def test_pareto_points_are_labelled_with_their_rates(tmp_path, drawn):
    jobs = pareto_jobs()
    palette = {"vllm": "C0", "sarathi": "C1"}
    plot_pareto(jobs, tmp_path / "pareto.png", palette)
    ax = drawn[0].axes[0]
    points = jobs.groupby(["label", "rate"])[["steady.median_tps",
                                              "steady.output_throughput_per_gpu"]].mean()
    labels = {(round(a.xy[0], 9), round(a.xy[1], 9)): a.get_text() for a in ax.texts}
    assert len(ax.texts) == len(points) == 6
    for (_, rate), (x, y) in points.iterrows():
        assert labels[(round(x, 9), round(y, 9))] == f"{rate:g}"


def visible_ticks(ax, renderer) -> list:
    """The y tick labels drawn inside ``ax``'s y range."""
    lo, hi = sorted(ax.get_ylim())
    return [t for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi
            and t.get_window_extent(renderer).height > 0]


@pytest.mark.parametrize("nodes", [16, 64])
def test_node_occupancy_stays_readable_for_many_nodes(nodes):
    fig = node_occupancy_figure(diffusion_records(nodes))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    heat = fig.axes[0]
    assert heat.get_images()  # the heat map, not a line per node
    row_inches = heat.get_position().height * fig.get_figheight() / nodes
    assert row_inches >= 0.1, f"{row_inches:.3f} in per node"
    assert fig.get_figheight() <= 16
    ticks = visible_ticks(heat, renderer)
    ids = [int(t.get_text()) for t in ticks]
    assert 4 <= len(ids) <= 16 and ids[0] == 0 and set(ids) <= set(range(nodes)), ids
    boxes = [t.get_window_extent(renderer) for t in ticks]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
