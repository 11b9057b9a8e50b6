# The two commands of README.md: `make demo` (main job) and `make test` (test suite).
# Both do all set-up on a fresh machine: install the package with its native library and the test tools.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: setup demo test bench-cpu

# The oldest NVRTC that pyproject.toml allows, the GPU machine's: pip resolves the newest 13.x for the package, and
# tests/test_cuda_ops_build.py builds every kernel with this one too (13.0 rejects code that later ones accept).
OLDEST_NVRTC := 13.0.88
OLDEST_NVRTC_DIR := build/oldest-nvrtc

# Set-up runs again only when what it installs or builds changed: the package metadata, the build script and
# the native library's sources (contract.py and the CUDA plan generate its headers). `rm build/setup.stamp`
# forces it.
SETUP_STAMP := build/setup.stamp
NATIVE_SOURCES := $(wildcard onnx_hybrid/ops/native/*) onnx_hybrid/ops/contract.py onnx_hybrid/cuda_ops/plan.py \
	onnx_hybrid/cuda_ops/kernels/params.cuh

# The stamp only counts while this Python has the package (another virtual environment may not).
setup:
	@$(PYTHON) -c "import importlib.metadata as m; m.version('onnx-hybrid'); m.version('pytest')" 2>/dev/null \
		|| rm -f $(SETUP_STAMP)
	@$(MAKE) --no-print-directory $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml setup.py $(NATIVE_SOURCES)
	@echo "setup: installing torch (CPU; the test oracle's) and onnx-hybrid with its test tools, building the native library"
	# torch only serves transformers as the test oracle; 2.13.0 is the CPU build on local disk.
	$(PIP) install --progress-bar on "torch==2.13.0"
	$(PIP) install --progress-bar on -e ".[test]"
	@mkdir -p $(@D) && touch $@
	@echo "setup: done (runs again when pyproject.toml, setup.py or the native sources change)"

$(OLDEST_NVRTC_DIR)/$(OLDEST_NVRTC).stamp:
	rm -rf $(OLDEST_NVRTC_DIR)
	$(PIP) download -q --no-deps "nvidia-cuda-nvrtc==$(OLDEST_NVRTC)" -d $(OLDEST_NVRTC_DIR)/wheel
	$(PYTHON) -m zipfile -e $(OLDEST_NVRTC_DIR)/wheel/nvidia_cuda_nvrtc-$(OLDEST_NVRTC)-*.whl $(OLDEST_NVRTC_DIR)
	rm -rf $(OLDEST_NVRTC_DIR)/wheel
	touch $@

demo: setup
	$(PYTHON) scripts/demo.py

test: setup $(OLDEST_NVRTC_DIR)/$(OLDEST_NVRTC).stamp
	$(PYTHON) -m pytest -q

bench-cpu: setup
	$(PYTHON) scripts/bench_cpu.py
