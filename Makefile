# The two commands of the README: `make demo` runs the main job, `make test` runs the suite.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: install test demo bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch first and explicitly: the CPU wheel on disk; an unpinned torch would download a CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/parcae simulate --trace p3 --model gpt-1.5b --start-hour 1.5 --end-hour 2.5 --plot plots/demo.png

bench: $(STAMP)
	$(BIN)/python benchmarks/planner_latency.py

clean:
	rm -rf $(VENV) .pytest_cache plots
