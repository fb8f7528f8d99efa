"""What the measurements were taken on: GPU, driver, torch, CUDA, cuDNN and NCCL versions."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

SMI_FIELDS = ("name", "driver_version", "persistence_mode", "clocks.sm", "clocks.max.sm",
              "clocks.mem", "power.limit", "temperature.gpu")


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (the ``device`` column of CPU rows)."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def parse_smi(text: str) -> dict:
    """One CSV line of ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader``."""
    values = [v.strip() for v in text.strip().splitlines()[0].split(",")] if text.strip() else []
    if len(values) != len(SMI_FIELDS):
        return {}
    return {f"smi_{k.replace('.', '_')}": v for k, v in zip(SMI_FIELDS, values, strict=True)}


def nvidia_smi(index: int = 0) -> dict:
    """Driver version, clocks, persistence mode and power limit of GPU ``index`` as nvidia-smi
    reports them (the collector asks for locked clocks; we record what they were)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"smi_error": "nvidia-smi not found"}
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(SMI_FIELDS)}",
                              "--format=csv,noheader", "-i", str(index)],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError) as e:
        return {"smi_error": str(e)[:200]}
    return parse_smi(out) or {"smi_error": f"unparsed output {out[:200]!r}"}


def nccl_version() -> str | None:
    """The NCCL version torch was built with, as "2.21.5" (None without NCCL)."""
    import torch

    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def environment(device: str) -> dict:
    """Versions and device facts for collection_meta.yaml; ``device_name`` is the string
    written in every row's ``device`` column (nvidia-smi's name on a GPU, the CPU model)."""
    import torch

    env = {"python": platform.python_version(), "torch": str(torch.__version__),
           "cuda": torch.version.cuda, "device_type": device, "cpu": cpu_name()}
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    env["cudnn"] = cudnn
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update({
            "gpu": props.name,
            "gpu_count": torch.cuda.device_count(),
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": int(props.total_memory),
            "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        })
        env["nccl"] = nccl_version()
        driver_api = getattr(torch._C, "_cuda_getDriverVersion", None)
        if driver_api is not None:
            v = int(driver_api())
            env["cuda_driver_api"] = f"{v // 1000}.{v % 1000 // 10}"
        smi = nvidia_smi(0)
        env.update(smi)
        env["driver"] = smi.get("smi_driver_version", "unknown")
        env["device_name"] = smi.get("smi_name", props.name)
    else:
        env.update({"gpu": None, "driver": None, "device_name": env["cpu"]})
    return env
