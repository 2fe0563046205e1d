"""parcae: the front door of liveput-optimised DNN training on spot instances — the ``parcae`` command line and
the checks the flows run first.

Map:

- `cli`          the command line, one module per command group (``parcae --help``; `parcae.cli` lists them);
- `settings`     fail-fast checks of a flow's parameters, of ``prefect.yaml`` and of the stores (`SettingError`);
- `progress`     what ``parcae train`` shows on stderr while a job runs (a trainer observer);
- `simulations`  a ``parcae simulate --mlflow`` comparison laid out as MLflow runs, and rebuilt from them.

Must not touch: the work itself — planning and simulation (`liveput`), traces and forecasters (`forecasting`), the
trainer (`trainer`), each reached through its face; Prefect lives in `flows/` and `tasks/`.
"""
