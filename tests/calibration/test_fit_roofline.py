"""The committed efficiency file is what the fit script produces from the shared tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from calibration.fit_roofline import main

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data" / "aiconfigurator" / "h100_sxm"
COMMITTED = REPO / "sim" / "cost" / "calibrated" / "h100_sxm" / "vllm.yaml"


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


@pytest.mark.skipif(not DATA.is_dir(), reason=f"measured op tables not found at {DATA}")
def test_fit_reproduces_the_committed_parameters(tmp_path):
    out = tmp_path / "vllm.yaml"
    assert main(["--data", str(DATA), "--hardware", "h100_sxm", "--out", str(out)]) == 0
    fresh = dict(_flat(yaml.safe_load(out.read_text())["parameters"]))
    committed = dict(_flat(yaml.safe_load(COMMITTED.read_text())["parameters"]))
    assert fresh.keys() == committed.keys()
    for key, value in committed.items():
        assert fresh[key] == pytest.approx(value, rel=1e-4, abs=1e-12), key


def test_missing_data_is_one_line(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nope"), "--out", str(tmp_path / "x.json")]) == 2
    assert "--data=" in capsys.readouterr().err
