"""The real public traces in ../shared/traces read and validate (skipped when absent)."""

import numpy as np
import pytest

from scenarios import LengthConfig, WorkloadConfig, WorkloadError, build_requests
from scenarios.traces import read_trace

# rows per file, from shared/traces/README.md
ROWS = {
    "azure2023_code.csv": 8_819,
    "azure2023_conv.csv": 19_366,
    "mooncake_conversation.csv": 12_031,
    "mooncake_synthetic.csv": 3_993,
    "alibaba_t2i_diffusion.csv": 26_823,
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_arrival_traces_read(shared_traces, name):
    df = read_trace(str(shared_traces / name))
    assert len(df) == ROWS[name]
    assert df["arrival_time_s"].iloc[0] == 0.0
    assert np.all(np.diff(df["arrival_time_s"].to_numpy()) >= 0)
    assert df["input_tokens"].dtype == np.int64 and df["output_tokens"].dtype == np.int64
    assert ("hash_ids" in df) == name.startswith("mooncake")
    if "hash_ids" in df:
        first = df["hash_ids"].iloc[0]
        assert isinstance(first, tuple) and all(isinstance(h, int) for h in first)
        # 512-token blocks: a request has ceil(input / 512) block hashes
        n_ids = df["hash_ids"].map(len).to_numpy()
        assert np.all(n_ids == -(-df["input_tokens"].to_numpy() // 512))


@pytest.mark.parametrize("name", ["azure2023_conv.csv", "mooncake_conversation.csv"])
def test_llm_traces_build(shared_traces, name):
    w = WorkloadConfig(
        name="t",
        arrival="trace",
        trace_path=str(shared_traces / name),
        window_start_s=600.0,
        window_end_s=1200.0,
        time_scale=0.5,
    )
    df = build_requests(w, np.random.default_rng(0), np.random.default_rng(0))
    assert df["arrival_time_s"].iloc[0] == 0.0 and df["arrival_time_s"].iloc[-1] < 300.0
    assert (df["input_tokens"] >= 1).all() and (df["output_tokens"] >= 1).all()


def test_diffusion_trace_needs_length_overrides(shared_traces):
    path = str(shared_traces / "alibaba_t2i_diffusion.csv")
    w = WorkloadConfig(name="t", arrival="trace", trace_path=path)
    with pytest.raises(WorkloadError, match="is 0 at row"):
        build_requests(w, np.random.default_rng(0), np.random.default_rng(0))
    w = WorkloadConfig(name="t", arrival="trace", trace_path=path, input_tokens=77, output_tokens=1)
    assert len(build_requests(w, np.random.default_rng(0), np.random.default_rng(0))) == 26_823


def test_sharegpt_is_lengths_only(shared_traces):
    path = str(shared_traces / "sharegpt_lengths.csv")
    with pytest.raises(WorkloadError, match="missing column 'arrival_time_s'"):
        read_trace(path)
    w = WorkloadConfig(
        name="t",
        num_requests=1000,
        input=LengthConfig(dist="empirical", path=path),
        output=LengthConfig(dist="empirical", path=path),
    )
    df = build_requests(w, np.random.default_rng(0), np.random.default_rng(0))
    assert df["input_tokens"].max() <= 8141 and df["output_tokens"].max() <= 1024
