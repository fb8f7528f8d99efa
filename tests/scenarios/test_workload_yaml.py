"""The shipped conf/workload/*.yaml compose against the WorkloadConfig schema and build."""

from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from scenarios import WorkloadConfig, build_jobs, build_requests, check_workload
from scenarios.rate_profile import RateProfile, has_profile

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
NAMES = sorted(p.stem for p in (CONF / "workload").glob("*.yaml"))


def test_expected_files_exist():
    assert {"chat", "poisson", "gamma", "closed_loop", "trace"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_compose_check_and_build(name, monkeypatch):
    ConfigStore.instance().store(group="workload", name="base_workload", node=WorkloadConfig)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(overrides=[f"+workload={name}"])
    w = cfg.workload
    assert OmegaConf.get_type(w) is WorkloadConfig
    assert w.name == name
    check_workload(w)
    if w.arrival == "trace":
        # relative paths resolve against the cwd; the project runs from the repo root
        if not (REPO / w.trace_path).is_file():
            pytest.skip(f"example trace {w.trace_path} not found relative to {REPO}")
        monkeypatch.chdir(REPO)
        w.max_requests = 100
    elif has_profile(w):
        w.rate_profile.hour_s = 1.0  # the day's shape, not its million requests
    else:
        w.num_requests = 200
    df = (build_jobs(w, "flux1_dev", 0) if w.kind == "diffusion" else
          build_requests(w, np.random.default_rng(0), np.random.default_rng(1)))
    if has_profile(w):  # as many as arrive over the span
        mean = RateProfile.from_config(w.rate_profile, w.rate).expected_arrivals
        assert abs(len(df) - mean) < 5 * np.sqrt(mean)
    else:
        assert len(df) == (100 if w.arrival == "trace" else 200)


def test_chat_is_the_sharegpt_fit():
    chat = OmegaConf.load(CONF / "workload" / "chat.yaml")
    assert chat.arrival == "poisson" and chat.rate == 5.0 and chat.num_requests == 2000
    assert chat.input.dist == chat.output.dist == "lognormal"
    assert chat.input.mu == pytest.approx(11.11, abs=0.01)
    assert chat.output.sigma == pytest.approx(2.39, abs=0.01)
