# The two commands of README.md: `make demo` (main job) and `make test` (test suite).
# Both do all set-up on a fresh machine: install the package with its native library and the test tools.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: setup demo test asan bench-cpu wheel

# The oldest NVRTC that pyproject.toml allows, the GPU machine's: pip resolves the newest 13.x for the package, and
# tests/cuda/test_cuda_ops_build.py builds every kernel with this one too (13.0 rejects code that later ones accept).
OLDEST_NVRTC := 13.0.88
OLDEST_NVRTC_DIR := build/oldest-nvrtc

# Set-up runs again only when what it installs or builds changed: the package metadata, the build script and
# the native library's sources (contract.py and the CUDA plan generate its headers). `rm build/setup.stamp`
# forces it.
SETUP_STAMP := build/setup.stamp
NATIVE_SOURCES := $(wildcard onnx_hybrid/ops/native/* onnx_hybrid/ops/native/*/* onnx_hybrid/ops/native/cuda/kernels/*) \
	onnx_hybrid/ops/contract.py

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

# The native library built with AddressSanitizer, and the tests marked asan run against it (tests/native/asan_runner.py).
asan: setup
	$(PYTHON) tests/native/asan_runner.py -q

bench-cpu: setup
	$(PYTHON) scripts/bench_cpu.py

# dist/onnx_hybrid-<version>-py3-none-manylinux_<glibc>_x86_64.whl: the library and the CUDA kernel images of
# library.DEFAULT_CUDA_ARCHS (compiled here through CuPy/NVRTC, about a minute per arch unless cached), so that
# installing it needs no compiler and CUDA sessions need no CuPy. Build tools come from this environment (offline).
WHEEL_CUDA_IMAGES := build/wheel-cuda-images

wheel: setup
	$(PIP) install -q "build>=1.2,<2" "wheel>=0.43" "auditwheel>=6,<7"
	# setuptools reuses build/lib* as its staging folder: files moved or deleted since would ride along.
	rm -rf $(WHEEL_CUDA_IMAGES) dist/onnx_hybrid-*.whl build/lib.* build/bdist.*
	PYTHONPATH=. $(PYTHON) -c "import sys, onnx_hybrid.ops.library as L; L.write_cuda_images(L.DEFAULT_CUDA_ARCHS, sys.argv[1])" \
		$(WHEEL_CUDA_IMAGES)
	ONNX_HYBRID_WHEEL_CUDA_IMAGES=$(WHEEL_CUDA_IMAGES) $(PYTHON) -m build --wheel --no-isolation --outdir dist
	$(PYTHON) -m auditwheel show dist/onnx_hybrid-*.whl
