# The two commands of README.md: `make demo` (main job) and `make test` (test suite).
# Both do all set-up on a fresh machine: install the package with its native library and the test tools.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: setup demo test bench-cpu

setup:
	# torch only serves transformers as the test oracle; 2.13.0 is the CPU build on local disk.
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test]"

demo: setup
	$(PYTHON) scripts/demo.py

test: setup
	$(PYTHON) -m pytest -q

bench-cpu: setup
	$(PYTHON) scripts/bench_cpu.py
