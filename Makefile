# The two commands of the README: `make demo` runs the main job, `make test` runs the suite.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false

PREFECT_PORT ?= 4200
export PREFECT_HOME ?= $(CURDIR)/.prefect
export PREFECT_LOGGING_EXTRA_LOGGERS := forecasting,liveput,parcae,trainer
export PREFECT_WORKER_QUERY_SECONDS := 5
export PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW := ignore

.PHONY: install test demo bench serve stop clean

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

# A local Prefect server (SQLite) on 127.0.0.1, the deployments of prefect.yaml, and a process worker in
# the foreground (Ctrl-C stops it; `make stop` stops the server). Flows log to ./mlruns unless
# MLFLOW_TRACKING_URI says otherwise.
serve: $(STAMP)
	$(BIN)/prefect server start --host 127.0.0.1 --port $(PREFECT_PORT) --analytics-off --background
	@for i in $$(seq 60); do curl -sf http://127.0.0.1:$(PREFECT_PORT)/api/health >/dev/null && break; sleep 1; done
	PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api $(BIN)/prefect work-pool create parcae-local --type process || true
	cd $(CURDIR) && PWD=$(CURDIR) PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api $(BIN)/prefect --no-prompt deploy --all
	PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api $(BIN)/prefect worker start --pool parcae-local

stop:
	-$(BIN)/prefect server stop

clean:
	rm -rf $(VENV) .pytest_cache plots .prefect
