# specdec-lab: `make reproduce` runs every notebook of a profile; `make test` runs the tests.
PROFILE ?= cpu
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: env test reproduce lab models clean-results

# The environment is (re)built when the requirements change; torch is pinned in the same file so
# pip takes the CPU wheel instead of a multi-GB CUDA build.
$(INSTALLED): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

env: $(INSTALLED)

test: env
	$(PY) -m pytest -q -rs  # -rs: the run ends by naming what it skipped and why

reproduce: env
	$(PY) -m specdec_lab.report --profile $(PROFILE)

# Download, verify and convert the offline zoo models once (reproduce does this on demand too).
models: env
	$(PY) -c "from specdec_lab.models import zoo; [print(zoo.ensure(n)) for n in zoo.ZOO]"

lab: env
	$(PY) -m ipykernel install --user --name specdec-lab --display-name "specdec-lab (.venv)"
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root,) notebooks/

clean-results:
	rm -rf results/$(PROFILE) reports/$(PROFILE)
