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

.PHONY: install test lint docs docs-cli docs-serve demo bench serve stop clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch first and explicitly: the CPU wheel on disk; an unpinned torch would download a CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,dev,hf,docs]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# ruff (lint, then format), mypy (strict on liveput, forecasting, tracking), the import contracts of pyproject.toml
# (lint-imports: no prefect in domain packages, imports down the floors, no cycles, faces only) and the two rules
# they cannot state: no private names across modules, no project module loaded by its name (an arrow they cannot see).
# Every check runs, so one failure does not hide the next; the target fails if any did.
LINT_CHECKS := "ruff check ." "ruff format --check ." "mypy" "lint-imports --no-cache" "python .ci/check_private_imports.py" "python .ci/check_hidden_imports.py"
lint: $(STAMP)
	@status=0; for check in $(LINT_CHECKS); do \
		echo "== $$check"; $(BIN)/$$check || status=1; \
	done; exit $$status

# The documentation site (mkdocs.yml: material theme, strict: a broken link or a page left out of the nav fails the
# build) into site/; docs-cli regenerates the CLI reference from the Typer app (tests/test_docs.py checks it is
# current); docs-serve serves the site on 127.0.0.1:8000.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-cli: $(STAMP)
	$(BIN)/python -m typer parcae.cli utils docs --name parcae --output docs/reference/cli.md

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

# The end-to-end pipeline (flows/pipeline.py: collect the bundled traces, retrain the forecaster, train under the
# local spot market following p3, with per-interval liveput plans) on an ephemeral Prefect API (no server; its database in
# $(PREFECT_HOME)) and the local MLflow store under mlruns/ (unless MLFLOW_TRACKING_URI says otherwise); it ends by
# printing the `mlflow ui` and `prefect server` commands that show the results. The runtime profile is measured
# on the first run and cached in runs/. The ephemeral API gets 120 s to start (Prefect's default, 20 s, is too short
# for a fresh install's first start on 2 cores: it timed out once here).
demo: $(STAMP)
	env -u PREFECT_API_URL PREFECT_SERVER_ALLOW_EPHEMERAL_MODE=true \
	    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=$${PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS:-120} \
	    $(BIN)/python -m flows.pipeline

bench: $(STAMP)
	$(BIN)/python benchmarks/planner_latency.py

# A local Prefect server (SQLite) on 127.0.0.1, the deployments of prefect.yaml (checked first: schedules, traces,
# parameters, the MLflow store; `python -m parcae.settings`; deployed by `python -m flows.deployments`, which pauses
# those that cannot run on this machine, saying why), and a process worker in the foreground (Ctrl-C stops
# it; `make stop` stops the server). Flows log to ./mlruns unless MLFLOW_TRACKING_URI says otherwise.
serve: $(STAMP)
	$(BIN)/python -m parcae.settings prefect.yaml
	PREFECT_UI_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api $(BIN)/prefect server start --host 127.0.0.1 \
		--port $(PREFECT_PORT) --analytics-off --background  # the UI asks for its API where the server is
	@for i in $$(seq 60); do curl -sf http://127.0.0.1:$(PREFECT_PORT)/api/health >/dev/null && break; sleep 1; done
	PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api $(BIN)/prefect work-pool create parcae-local --type process || true
	cd $(CURDIR) && PWD=$(CURDIR) PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api $(BIN)/python -m flows.deployments prefect.yaml
	PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api $(BIN)/prefect worker start --pool parcae-local

stop:
	-$(BIN)/prefect server stop

clean:
	rm -rf $(VENV) .pytest_cache plots .prefect
