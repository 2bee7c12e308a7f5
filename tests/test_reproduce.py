"""`make reproduce` as a researcher meets it, on the smoke profile: the reports render with their
figures and without errors (checked in headless Chromium), and an interrupted run resumes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec_lab import report
from specdec_lab.decoders import suffix
from specdec_lab.runs import bench, jsonl
from specdec_lab.runs.paths import INTERACTIVE_NOTEBOOKS

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def reproduce_command(results: Path, reports: Path, *only: str) -> list[str]:
    command = [sys.executable, "-m", "specdec_lab.report", "--profile", "smoke",
               "--results-dir", str(results), "--reports-dir", str(reports)]
    return command + (["--only", *only] if only else [])


@pytest.fixture(scope="module")
def smoke_reports(tmp_path_factory):
    base = tmp_path_factory.mktemp("smoke")
    done = subprocess.run(reproduce_command(base / "results", base / "reports"), cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return base / "reports"


def dump_dom(page: Path, tmp_path: Path) -> str:
    """The page as Chromium renders it (headless, no network, a throwaway profile)."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'chromium'}",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


IN_CI = os.environ.get("CI") == "true"
TOKEN_VIEWS = {"02_speculative", "03_quantized", "04_cllm"}  # the reports that show each method's text token by token


@pytest.mark.integration
@pytest.mark.skipif(CHROMIUM is None and not IN_CI, reason="headless Chromium is not installed (.ci/run installs it)")
def test_index_and_every_report_render_with_figures_and_no_errors(smoke_reports, tmp_path):
    assert CHROMIUM is not None, "CI=true but headless Chromium is missing: .ci/run must install it (apt-get install chromium)"
    index = dump_dom(smoke_reports / "index.html", tmp_path)
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb") if p.stem not in INTERACTIVE_NOTEBOOKS)
    for stem in notebooks:
        assert f'href="{stem}.html"' in index, stem
        assert "FAILED" not in index
    for stem in notebooks:
        dom = dump_dom(smoke_reports / f"{stem}.html", tmp_path)
        assert "Traceback" not in dom and "This step stopped" not in dom, stem
        assert dom.count("<img") >= 1, f"{stem} shows no figure"
        if stem in TOKEN_VIEWS:  # the text token by token, with its legend and a tooltip per token
            assert 'class="tv-legend"' in dom and 'title="step 0' in dom, f"{stem} shows no token view"
        assert "highlight hl-ipython3" not in dom, f"{stem}: code should be hidden in the default render"
        assert "highlight hl-ipython3" in (smoke_reports / f"{stem}.code.html").read_text()
    # a wide table tagged report.FULL_TABLES is in the code twin only; the reader's render shows the compact one
    reader, twin = (smoke_reports / "02_speculative.html").read_text(), (smoke_reports / "02_speculative.code.html").read_text()
    assert "pairs_of_other_length" not in reader and "pairs_of_other_length" in twin
    assert "speedup (95% CI)" in reader


@pytest.mark.integration
def test_an_interrupted_reproduce_resumes_without_recomputing(tmp_path, smoke_reports):
    results, reports = tmp_path / "results", tmp_path / "reports"
    runs = results / "01_baseline" / "runs.jsonl"
    process = subprocess.Popen(reproduce_command(results, reports, "01_baseline"), cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        if runs.exists() and len(jsonl.read(runs)) >= 5:  # prompt 1 done (4 methods), prompt 2 begun
            os.killpg(process.pid, signal.SIGKILL)  # as hard as a crash: no cleanup runs
            break
        time.sleep(0.02)
    process.wait()
    before = jsonl.read(runs)
    assert 5 <= len(before) < 8, "the run should have been interrupted inside prompt 2 (4 methods x 2 prompts)"

    done = subprocess.run(reproduce_command(results, reports, "01_baseline"), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    after = jsonl.read(runs)
    assert after[: len(before)] == before  # nothing finished was lost
    names = [r["decoder"] for r in before[:4]]
    units = bench.complete_units(after, names)
    assert len(units) == 2 and units[(before[0]["prompt_id"], 0)] == before[:4]  # prompt 1 was not recomputed
    second = units[(before[4]["prompt_id"], 0)]  # prompt 2 ran again whole, in one process: its ratios pair up
    assert len({r["process"] for r in second}) == 1 and second[0]["process"] != before[4]["process"]
    rows = [row for unit in units.values() for row in unit]

    # the same texts as a run never interrupted: the smoke run's, in results of its own
    fresh = smoke_reports.parent / "results"
    tokens = lambda rows: sorted((r["decoder"], r["prompt_id"], r["repeat"], r["tokens"]) for r in rows)
    assert tokens(rows) == tokens(jsonl.read(fresh / "01_baseline" / "runs.jsonl"))


@pytest.mark.integration
def test_lossless_methods_reproduce_ar_greedy_exactly_in_fp32(smoke_reports):
    """The fp32 control is asserted, not only displayed: every method declared lossless (ours, transformers'
    and arctic-inference's suffix tree where `make arctic` built it) reproduces AR greedy token for token, and so does Jacobi decoding of the base model."""
    results = smoke_reports.parent / "results"
    control = jsonl.read(results / "02_speculative" / "fp32_control.jsonl")
    reference = {r["prompt_id"]: r["tokens"] for r in control if r["role"] == "target AR"}
    lossless = [r for r in control if r["lossless"] and r["role"] != "target AR"]
    peers = {"ours", "transformers"} | ({"arctic-inference"} if suffix.arctic_available() else set())
    assert {r["implementation"] for r in lossless} == peers and len(reference) >= 1
    assert "suffix" in {r["source_kind"] for r in lossless}  # suffix decoding is checked too
    assert [(r["decoder"], r["prompt_id"]) for r in lossless if r["tokens"] != reference[r["prompt_id"]]] == []
    held_out = jsonl.read(results / "04_cllm" / "held_out.jsonl")
    ar = {r["prompt_id"]: r["tokens"] for r in held_out if r["role"] == "target AR"}
    jacobi = [r for r in held_out if r["lossless"] and r["role"] == "parallel"]
    assert jacobi and all(r["tokens"] == ar[r["prompt_id"]] for r in jacobi)
    # batches: every request of every declared-lossless method, at every batch size, is its prompt's batch-1 AR text
    batches = jsonl.read(results / "05_batch" / "runs.jsonl")
    single = {r["prompt_id"]: r["tokens"] for r in batches if r["role"] == "target AR" and r["implementation"] == "ours"
              and r["batch_size"] == 1}
    batched = [r for r in batches if r["lossless"] and (r["batch_size"] > 1 or r["role"] != "target AR")]
    assert {r["role"] for r in batched} == {"target AR", "speculative"} and len(single) >= 2
    assert {r["batch_size"] for r in batched} == {r["batch_size"] for r in batches}  # every batch size, b = 1 too
    assert [(r["decoder"], r["batch_size"], r["prompt_id"]) for r in batched if r["tokens"] != single[r["prompt_id"]]] == []


def test_an_error_shows_a_message_and_a_hint_not_a_traceback():
    notebook = {"cells": [{"outputs": [{"output_type": "error", "ename": "OutOfMemoryError",
                                        "evalue": "CUDA out of memory", "traceback": ["..."]}]}]}
    assert report.replace_tracebacks(notebook) == 1
    text = notebook["cells"][0]["outputs"][0]["text"]
    assert "OutOfMemoryError" in text and "lower max_new_tokens" in text
