"""Which machine a number was measured on: the CPU's model name and the kernel flags that decide
its bf16 and integer speed. Infrastructure: imports nothing of the kit."""

from __future__ import annotations

from pathlib import Path

KERNEL_FLAGS = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512f", "avx2")  # what decides bf16/int speed


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> dict:
    """The CPU's model name and which of KERNEL_FLAGS it has: the same code runs 2.6x apart in bf16
    on an Intel Xeon with AMX and an AMD EPYC without (empty where /proc/cpuinfo is missing)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return {"cpu_model": None, "cpu_flags": None}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    return {"cpu_model": fields.get("model name"), "cpu_flags": [flag for flag in KERNEL_FLAGS if flag in flags]}
