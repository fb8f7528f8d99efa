#!/usr/bin/env bash
# The one prepared profiler run for a session with a lent GPU (issue 3, item 6): prints the
# versions, runs the full shape plan (GEMM, prefill/decode attention, MoE; collectives when more
# than one GPU is visible), first two probes (scripts/conv3d_probe.py: 3D convolutions;
# scripts/sustained_probe.py: a GEMM under sustained load), and leaves in $OUT four files (the
# device tool returns at most 8, at most 2 folders deep, so the table tree travels as one
# archive):
#   profile.log              everything printed, ending with a summary of achieved rates
#   profile_tables.tar.gz    <op>/<framework>/<version>/<table>.parquet + collection_meta.yaml
#   conv3d_probe.csv         channels-first vs channels-last 3D convolutions (ms, TFLOP/s, kernels)
#   sustained_probe.csv      a bf16 GEMM's TFLOP/s, SM clock and power, second by second
#
# On the device machine, from the repository root (the profiler's time budget is BUDGET_S, 360 s
# by default, so the whole command stays well under 10 minutes):
#   bash scripts/device_profile.sh
# If the device image lacks the project's pure-Python dependencies that the profiler imports
# (simpy, omegaconf; the H200 image has numpy, pandas, pyarrow, pyyaml and torch; `import sim`
# loads the engine and numba only when `simulate` is used), prepare their
# wheels here first, where PyPI is reachable, and name `.whl` in the run's carry:
#   echo /.whl/ >> .git/info/exclude; bash scripts/device_profile.sh --prepare
# Dry run of the same logic on a CPU with a CPU build of torch:
#   DEVICE=cpu PLAN=tiny OUT=/tmp/out PY=/tmp/torchvenv/bin/python bash scripts/device_profile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}

if [[ "${1:-}" == "--prepare" ]]; then
  mkdir -p .whl
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 -d .whl \
    "simpy>=4.1,<5" "omegaconf>=2.3,<2.5"
  "$PY" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.*"
  ls -l .whl
  exit 0
fi

: "${OUT:?set OUT to the folder the results go to}"
DEVICE=${DEVICE:-cuda}
PLAN=${PLAN:-full}
BUDGET_S=${BUDGET_S:-360}
WORK=${WORK:-/tmp/profile_tables}
export PYTHONUNBUFFERED=1

profile() {
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m) repo $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,persistence_mode \
      --format=csv
  fi
  "$PY" - <<'EOF'
import platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuDNN", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("GPUs", torch.cuda.device_count(), "|", p.name, "| SMs", p.multi_processor_count,
          "| memory GiB", round(p.total_memory / 2**30, 1), "| NCCL", torch.cuda.nccl.version())
EOF
  # the video VAE's 3D convolutions, channels-first against channels-last (sim/cost/conv3d.py:
  # a class inferred from whole jobs; ~30 s): conv3d_probe.csv
  echo "== conv3d probe at $(date -u +%H:%M:%SZ)"
  timeout 60 "$PY" scripts/conv3d_probe.py --out "$OUT" --device "$DEVICE" \
    $([[ "$PLAN" == tiny ]] && echo --tiny) || echo "== conv3d probe exit code $?"
  # a bf16 GEMM back to back for 30 s: TFLOP/s, SM clock and power per second (does the
  # GPU keep the operator tables' rate under sustained load?): sustained_probe.csv
  echo "== sustained GEMM probe at $(date -u +%H:%M:%SZ)"
  timeout 45 "$PY" scripts/sustained_probe.py --out "$OUT" --device "$DEVICE" \
    $([[ "$PLAN" == tiny ]] && echo --size 256 --seconds 2) \
    || echo "== sustained probe exit code $?"
  if ! "$PY" -c "import calibration.profile.runner" 2>/dev/null; then
    if compgen -G ".whl/*.whl" >/dev/null; then
      echo "== installing carried wheels: $(ls .whl | tr '\n' ' ')"
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
      export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    "$PY" -c "import calibration.profile.runner" || {
      echo "calibration.profile cannot be imported (see above): run"\
        "'bash scripts/device_profile.sh --prepare' here and carry .whl"; return 3; }
  fi
  rm -rf "$WORK"
  local rc=0
  timeout 470 "$PY" -m calibration.profile out_dir="$WORK" device="$DEVICE" plan="$PLAN" \
    budget_s="$BUDGET_S" || rc=$?
  if [[ -d "$WORK" ]]; then
    tar czf "$OUT/profile_tables.tar.gz" -C "$WORK" .
    echo "== tables: $OUT/profile_tables.tar.gz ($(find "$WORK" -name '*.parquet' | wc -l) parquet files)"
  fi
  echo "== profiler exit code $rc at $(date -u +%H:%M:%SZ)"
  return "$rc"
}

mkdir -p "$OUT"
profile 2>&1 | tee "$OUT/profile.log"
