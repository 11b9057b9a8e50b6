# The two commands of README.md: `make demo` (main job) and `make test` (test suite).
# Both do all set-up on a fresh machine: install the package with its native library and the test tools.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: setup demo test bench-cpu wheel

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

# dist/onnx_hybrid-<version>-py3-none-manylinux_<glibc>_x86_64.whl: the library and the CUDA kernel images of
# library.DEFAULT_CUDA_ARCHS (compiled here through CuPy/NVRTC, about a minute per arch unless cached), so that
# installing it needs no compiler and CUDA sessions need no CuPy. Build tools come from this environment (offline).
WHEEL_CUDA_IMAGES := build/wheel-cuda-images

wheel: setup
	$(PIP) install -q "build>=1.2,<2" "wheel>=0.43" "auditwheel>=6,<7"
	rm -rf $(WHEEL_CUDA_IMAGES) dist/onnx_hybrid-*.whl
	PYTHONPATH=. $(PYTHON) -c "import sys, onnx_hybrid.ops.library as L; L.write_cuda_images(L.DEFAULT_CUDA_ARCHS, sys.argv[1])" \
		$(WHEEL_CUDA_IMAGES)
	ONNX_HYBRID_WHEEL_CUDA_IMAGES=$(WHEEL_CUDA_IMAGES) $(PYTHON) -m build --wheel --no-isolation --outdir dist
	$(PYTHON) -m auditwheel show dist/onnx_hybrid-*.whl
