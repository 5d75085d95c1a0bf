# The venv lives in .venv; every target uses it, so nothing leaks into the system Python.
PY      := .venv/bin/python
UV      := .venv/bin/uv
STOKE   := .venv/bin/stoke
DEMO    := .stoke/demo/digits
ROOT    := .stoke/root

export PREFECT_SERVER_ANALYTICS_ENABLED := false
# TensorFlow's C++ log at FATAL only, as Stoke starts its programs (components/common/runtime_logs.py);
# a level of your own wins: `TF_CPP_MIN_LOG_LEVEL=0 make run` shows TensorFlow's own lines.
export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: install install-test lock run test bench clean

# The locks, every package pinned with its hashes for Python 3.11 on Linux x86_64 (tfx-bsl 1.21 has no
# wheel for Linux on aarch64): requirements/runtime.lock, what running needs, and requirements/test.lock,
# the same with the test tools. `make install`, CI and the training image install exactly these, with uv
# (the lock's own); Stoke itself goes on top, editable, without dependencies. `make lock` writes them
# from pyproject.toml and requirements/constraints.txt as PyPI was at LOCK_DATE, so running it twice
# writes the same files; raise LOCK_DATE to take newer releases.
LOCK_DATE := 2026-12-06T00:00:00Z
LOCK_FLAGS := --python-version 3.11 --python-platform x86_64-manylinux_2_28 --exclude-newer $(LOCK_DATE) \
	--generate-hashes --upgrade --group pyproject.toml:install -c requirements/constraints.txt \
	--custom-compile-command "make lock" --quiet

lock: .venv/.uv
	$(UV) pip compile pyproject.toml $(LOCK_FLAGS) -o requirements/runtime.lock
	$(UV) pip compile pyproject.toml --extra test -c requirements/runtime.lock $(LOCK_FLAGS) -o requirements/test.lock

# TensorFlow, Beam, Prefect and TFMA are about 1.5 GB to download the first time; then a target is done
# until its lock changes.
install: .venv/.installed
install-test: .venv/.installed-test

# uv first, by its hash in the lock (pip checks it), then uv installs the rest, compiled to bytecode as pip
# does: where PYTHONDONTWRITEBYTECODE is set, as on CI's machines, every process would otherwise compile
# Prefect, TensorFlow and Beam from source again (Prefect's test server took 100 s to start instead of 45).
# Stoke's build backend, setuptools, is in the lock (TensorBoard needs it), so its editable install builds
# in the venv itself, with nothing more to fetch.
.venv/.uv: requirements/runtime.lock
	python3.11 -m venv .venv
	awk '/^uv==/ {on = 1} on {print} on && !/\\$$/ {exit}' requirements/runtime.lock \
		| $(PY) -m pip install --quiet --no-deps --require-hashes -r /dev/stdin
	touch $@

.venv/.installed: requirements/runtime.lock pyproject.toml .venv/.uv
	@echo "Installing Stoke into .venv from requirements/runtime.lock (TensorFlow, Beam, Prefect, TFMA)..."
	$(UV) pip sync --quiet --python $(PY) --require-hashes --compile-bytecode requirements/runtime.lock
	$(UV) pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .
	touch $@

.venv/.installed-test: requirements/test.lock .venv/.installed
	@echo "Installing the test tools into .venv from requirements/test.lock (pytest, moto, mkdocs, ...)..."
	$(UV) pip sync --quiet --python $(PY) --require-hashes --compile-bytecode requirements/test.lock
	$(UV) pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .
	touch $@

# The whole pipeline once on the demo digits (the train flow, ephemeral Prefect): a couple of minutes on 2 cores.
run: install
	$(STOKE) demo $(DEMO)
	$(STOKE) run $(DEMO) --root $(ROOT) --preset demo

# A worker that dies ends the run with its test named (--max-worker-restart=0): a replacement worker
# was seen to wait for the rest of the crashed worker's file until CI's limit.
# Lint first (ruff, configured in pyproject.toml), then every import of what `stoke` runs against the declared
# dependencies (deptry, configured there too: a package only the test extras bring fails it), then the docs
# (a broken link fails); pytest exits 5 when it collects no tests, which is not a failure of the code. Tests run on TEST_WORKERS pytest-xdist
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
