# The venv lives in .venv; every target uses it, so nothing leaks into the system Python.
PY      := .venv/bin/python
STOKE   := .venv/bin/stoke
DEMO    := .stoke/demo/digits
ROOT    := .stoke/root

export PREFECT_SERVER_ANALYTICS_ENABLED := false
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: install install-test run test bench clean

# What running needs; the test tools come with `make test`. pip downloads TensorFlow, Beam, Prefect
# and TFMA the first time (about 1.5 GB), then the target is done until pyproject.toml changes.
install: .venv/.installed
install-test: .venv/.installed-test

.venv/.installed: pyproject.toml
	@echo "Installing Stoke into .venv (TensorFlow, Beam, Prefect, TFMA): a few minutes the first time..."
	python3.11 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

.venv/.installed-test: .venv/.installed
	@echo "Installing the test tools into .venv (pytest, moto, mkdocs, ...): a minute or two the first time..."
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

# The whole pipeline once on the demo digits (the train flow, ephemeral Prefect): a couple of minutes on 2 cores.
run: install
	$(STOKE) demo $(DEMO)
	$(STOKE) run $(DEMO) --root $(ROOT) --preset demo

# A worker that dies ends the run with its test named (--max-worker-restart=0): a replacement worker
# was seen to wait for the rest of the crashed worker's file until CI's limit.
# Lint first (ruff, configured in pyproject.toml), then every import of what `stoke` runs against the declared
# dependencies (deptry, configured there too: a package only the test extras bring fails it), then the docs
# (a broken link fails); pytest exits 5
# when it collects no tests, which is not a failure of the code. Tests run on TEST_WORKERS pytest-xdist
# workers, a test file's tests on one worker (--dist loadfile: a model a file's fixture trains is trained
# once), the longest files first (tests/conftest.py; --no-loadscope-reorder keeps that order instead of
# sorting files by how many tests they hold); TEST_WORKERS=0 runs them in this process. One worker more
# than the cores: a worker waiting on a stage program, a server or a subprocess leaves its core to another
# (measured on 2 cores: 724 s on 3 workers, 757 s on 4, about 790 s on 2).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

test: install-test
	$(PY) -m ruff check .
	$(PY) -m deptry .
	$(PY) -m mkdocs build --strict --quiet --site-dir "$$(mktemp -d)"
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --max-worker-restart=0 || [ $$? -eq 5 ]

# Each prints one JSON object of figures measured side by side; compare the ratios, not the times.
bench: install-test
	$(PY) benchmarks/ingest.py
	$(PY) benchmarks/input.py
	$(PY) benchmarks/train.py

clean:
	rm -rf .stoke
