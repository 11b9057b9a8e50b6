# The two commands of README.md: `make demo` (main job) and `make test` (test suite).
# Both do all set-up on a fresh machine: install the package with its native library and the test tools.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: setup demo test bench-cpu

# The oldest NVRTC that pyproject.toml allows, the GPU machine's: pip resolves the newest 13.x for the package, and
# tests/test_cuda_ops_build.py builds every kernel with this one too (13.0 rejects code that later ones accept).
OLDEST_NVRTC := 13.0.88
OLDEST_NVRTC_DIR := build/oldest-nvrtc

setup:
	# torch only serves transformers as the test oracle; 2.13.0 is the CPU build on local disk.
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test]"

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
