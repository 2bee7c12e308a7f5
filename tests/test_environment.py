"""environment.yml (conda users) and requirements.txt (make) must pin the same packages."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def requirement_lines() -> set[str]:
    lines = (line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines())
    return {line for line in lines if line}


def test_environment_yml_pins_what_requirements_txt_pins():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    assert {p for p in pip_section if p != "-e ."} == requirement_lines()
    assert "-e ." in pip_section and "python=3.11" in environment["dependencies"]


def test_torch_is_pinned_with_everything_else():
    # an unpinned torch pulls a multi-GB CUDA build; pinned here, pip takes the CPU wheel
    assert "torch==2.13.0" in requirement_lines()
    assert all("==" in line for line in requirement_lines())
