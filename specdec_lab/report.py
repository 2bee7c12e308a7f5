"""`make reproduce`: validate every parameter file of a profile, execute the notebooks with
papermill, render each to HTML (code hidden, plus a copy with code) and write an index page.

    python -m specdec_lab.report --profile cpu [--only 01_baseline 02_speculative]
"""

from __future__ import annotations

import argparse
import html
import sys
import time
from pathlib import Path

from specdec_lab import params
from specdec_lab.runs import outputs
from specdec_lab.runs.paths import NOTEBOOKS_DIR, PARAMS_DIR, REPO_ROOT, REPORTS_DIR


def profiles() -> list[str]:
    return sorted(p.name for p in PARAMS_DIR.iterdir() if p.is_dir())


def parameter_files(profile: str, only: list[str] | None = None) -> list[Path]:
    folder = PARAMS_DIR / profile
    if not folder.is_dir():
        raise params.ParameterError(f"unknown profile {profile!r}: known are {profiles()} (PROFILE=... in make)")
    files = sorted(folder.glob("*.yaml"))
    if only:
        unknown = sorted(set(only) - {f.stem for f in files})
        if unknown:
            raise params.ParameterError(f"profile {profile!r} has no parameter file for {unknown}")
        files = [f for f in files if f.stem in only]
    if not files:
        raise params.ParameterError(f"profile {profile!r} has no parameter files in {folder}")
    return files


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def validate_all(files: list[Path]) -> dict[str, dict]:
    """Check every file before anything runs, so a typo in the last notebook's YAML fails in
    seconds, not after an hour of benchmarks."""
    values, found = {}, []
    for path in files:
        try:
            values[path.stem] = params.load_yaml(path)
            problems = params.problems(path.stem, values[path.stem])
            problems = problems or params.pair_problems(values[path.stem])  # tokenizers only if the rest is fine
            found += [f"{_shown(path)}: {p}" for p in problems]
        except params.ParameterError as error:
            found.append(f"{_shown(path)}: {error}")
    if found:
        raise params.ParameterError("bad parameter files (nothing was run):\n- " + "\n- ".join(found))
    return values


HINTS = {
    "OutOfMemoryError": "out of memory: lower max_new_tokens or num_prompts, pick a smaller model, or load it quantized",
    "MemoryError": "out of memory: lower max_new_tokens or num_prompts, pick a smaller model, or load it quantized",
    "FileNotFoundError": "a file is missing: check the paths in the parameter file",
    "ParameterError": "fix the parameter file named above and run again",
}


def hint_for(ename: str, evalue: str) -> str:
    if "out of memory" in evalue.lower():
        return HINTS["OutOfMemoryError"]
    return HINTS.get(ename, "see the message above; finished samples are kept, a rerun resumes")


def replace_tracebacks(notebook) -> int:
    """A report is read by people who did not write the code: an error cell shows the error's
    message and what to do, not a stack trace (the executed .ipynb keeps the full traceback)."""
    replaced = 0
    for cell in notebook["cells"]:
        for index, output in enumerate(cell.get("outputs", [])):
            if output.get("output_type") == "error":
                message = f"This step stopped: {output['ename']}: {output['evalue']}\nWhat to do: {hint_for(output['ename'], output['evalue'])}\n"
                cell["outputs"][index] = {"output_type": "stream", "name": "stderr", "text": message}
                replaced += 1
    return replaced


FULL_TABLES = "full-table"  # a notebook cell whose wide table belongs in the `.code.html` twin (and the CSVs)


def render_html(executed: Path, out_dir: Path) -> list[Path]:
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import TagRemovePreprocessor

    notebook = nbformat.read(executed, as_version=4)
    replace_tracebacks(notebook)
    written = []
    for suffix, exclude_code in ((".html", True), (".code.html", False)):
        exporter = HTMLExporter(exclude_input=exclude_code, exclude_input_prompt=True, exclude_output_prompt=True)
        if exclude_code:  # the reader's render: a cell tagged FULL_TABLES shows in the code twin only
            exporter.register_preprocessor(TagRemovePreprocessor(remove_cell_tags={FULL_TABLES}), enabled=True)
        body, _ = exporter.from_notebook_node(notebook)
        path = out_dir / (executed.stem + suffix)
        path.write_text(body)
        written.append(path)
    return written


def write_index(profile: str, out_dir: Path, statuses: dict[str, str], results_dirs: dict[str, str]) -> Path:
    """Link every notebook of the profile that has a report in `out_dir` (this run's and earlier
    ones'), with its headline numbers."""
    rows = []
    for stem in sorted(p.stem for p in out_dir.glob("*.ipynb")):
        numbers = outputs.read_headline(results_dirs.get(stem, f"results/{profile}"), stem)
        status = statuses.get(stem, "from an earlier run")
        figures = "".join(f"<li>{html.escape(str(k))}: <b>{html.escape(str(v))}</b></li>" for k, v in numbers.items())
        rows.append(
            f"<tr><td><a href=\"{stem}.html\">{stem}</a> (<a href=\"{stem}.code.html\">with code</a>)</td>"
            f"<td>{html.escape(status)}</td><td><ul>{figures}</ul></td></tr>"
        )
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>specdec-lab: {profile}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{border-bottom:1px solid #ddd;padding:.5em;vertical-align:top}</style>"
        f"</head><body><h1>specdec-lab reports: profile <code>{html.escape(profile)}</code></h1>"
        "<table><tr><th>notebook</th><th>status</th><th>headline numbers</th></tr>" + "".join(rows) + "</table>"
        "<p>To run your own prompt through any method: <code>make lab</code> opens the explorer, "
        "<code>notebooks/00_explore.ipynb</code>.</p>"
        f"<p>Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by <code>make reproduce PROFILE={html.escape(profile)}</code>.</p>"
        "</body></html>"
    )
    index = out_dir / "index.html"
    index.write_text(page)
    return index


def reproduce(profile: str, only: list[str] | None = None, results_dir: str | None = None,
              reports_dir: str | Path | None = None) -> int:
    """Run the profile's notebooks; `results_dir` / `reports_dir` override where results and
    reports go (tests use temporary folders)."""
    import papermill

    files = parameter_files(profile, only)
    values = validate_all(files)
    if results_dir is not None:
        for notebook_values in values.values():
            notebook_values["results_dir"] = str(results_dir)
    out_dir = Path(reports_dir) if reports_dir is not None else REPORTS_DIR / profile
    out_dir.mkdir(parents=True, exist_ok=True)
    statuses, failed = {}, []
    for path in files:
        stem = path.stem
        executed = out_dir / f"{stem}.ipynb"
        print(f"== {stem} ({profile})", flush=True)
        started = time.time()
        try:
            papermill.execute_notebook(
                str(params.notebook_path(stem)), str(executed), parameters=values[stem],
                cwd=str(NOTEBOOKS_DIR), progress_bar=True, kernel_name="python3",
            )
            status = f"ok in {time.time() - started:.0f} s"
        except papermill.PapermillExecutionError as error:
            status = f"FAILED: {error.ename}: {error.evalue} -- {hint_for(error.ename, error.evalue)}"
            failed.append(f"{stem}: {status}")
        if executed.exists():
            render_html(executed, out_dir)
        statuses[stem] = status
        print(f"   {status}", flush=True)
    results_dirs = {stem: v.get("results_dir", f"results/{profile}") for stem, v in values.items()}
    index = write_index(profile, out_dir, statuses, results_dirs)
    print(f"index: {index}")
    if failed:
        print("some notebooks failed (their reports show where):\n- " + "\n- ".join(failed), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--only", nargs="*", help="notebook stems to run (default: all of the profile)")
    parser.add_argument("--results-dir", help="write results here instead of the profile's results_dir")
    parser.add_argument("--reports-dir", help="write reports here instead of reports/<profile>")
    args = parser.parse_args(argv)
    try:
        return reproduce(args.profile, args.only, args.results_dir, args.reports_dir)
    except params.ParameterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
