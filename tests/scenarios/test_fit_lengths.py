"""fit_lengths: maximum likelihood of a truncated lognormal, and the command-line output."""

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from scenarios.fit_lengths import fit_truncated_lognormal, main
from scenarios.lengths import truncated_lognormal_ppf


@pytest.mark.parametrize("mu,sigma,low,high", [(5.0, 1.5, 1, 1000), (9.0, 2.5, 1, 1024)])
def test_recovers_parameters(mu, sigma, low, high):
    u = np.random.default_rng(0).uniform(size=20_000)
    x = truncated_lognormal_ppf(u, mu, sigma, low, high)
    fit = fit_truncated_lognormal(x, low, high)
    assert fit.mu == pytest.approx(mu, abs=0.15 * sigma)
    assert fit.sigma == pytest.approx(sigma, rel=0.05)
    assert (fit.n, fit.dropped) == (20_000, 0)


def test_cli_prints_pasteable_yaml(tmp_path, capsys):
    rng = np.random.default_rng(1)
    path = tmp_path / "lengths.csv"
    pd.DataFrame(
        {
            "input_tokens": np.rint(truncated_lognormal_ppf(rng.uniform(size=3000), 6, 1, 1, 8192)),
            "output_tokens": np.rint(
                truncated_lognormal_ppf(rng.uniform(size=3000), 5, 1, 1, 1024)
            ),
        }
    ).astype(int).to_csv(path, index=False)
    assert main([str(path)]) == 0
    cfg = OmegaConf.create(capsys.readouterr().out)
    assert cfg.input.dist == "lognormal" and (cfg.input.low, cfg.input.high) == (1, 8192)
    assert cfg.output.high == 1024
    assert cfg.input.mu == pytest.approx(6, abs=0.1)
    assert cfg.output.sigma == pytest.approx(1, abs=0.1)


def test_cli_bad_input_exits_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing.csv")]) == 2
    assert "file not found" in capsys.readouterr().err
    path = tmp_path / "x.csv"
    path.write_text("input_tokens,output_tokens\n5,5\n")
    assert main([str(path), "--low-input", "10", "--high-input", "5"]) == 2
