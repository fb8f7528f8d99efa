"""``python -m sim.explain``: the step table adds up and names the right roofs."""

from __future__ import annotations

import pytest

from sim.errors import ConfigError
from sim.explain import batch_shape, explain, main


def test_table_adds_up_to_the_step_time(compose_cfg):
    new, ctx = batch_shape("64x2048", "1x2048+512")
    assert list(new[:2]) == [1, 1] and new[-1] == 2048 and ctx[-1] == 512
    table, totals = explain(compose_cfg(), new, ctx)
    assert table["time_us"].sum() / 1e3 == pytest.approx(totals["step_ms"])
    assert table["share_%"].sum() == pytest.approx(100)
    rows = table.set_index("operator")
    assert rows.loc["attn_decode", "bound"] == "memory"
    assert rows.loc["gate_up_proj", "bound"] == "compute"  # 2112 tokens: above the ridge
    assert totals["ridge_flop_per_byte"] == pytest.approx(989.4e12 / 3.35e12)


def test_cli_prints_the_table(capsys):
    assert main(["--decode", "8x100", "cost_model.host_overhead_ms=0.1"]) == 0
    out = capsys.readouterr().out
    assert "ridge point 295 FLOP/B" in out and "qkv_proj" in out and "mostly memory-bound" in out


@pytest.mark.parametrize("text", ["6x", "x5", "3*4", "0x0"])
def test_bad_shape_is_one_line(text, capsys):
    if text == "0x0":
        with pytest.raises(ConfigError):
            batch_shape(text, None)
        return
    assert main(["--decode", text]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--decode" in err
