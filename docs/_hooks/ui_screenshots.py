"""Screenshots of what a user sees after `make demo`: the MLflow run page of the training run, the MLflow model
registry and the forecaster's version, and the Prefect deployment and flow-run pages, taken by headless Chromium
(Debian's `chromium` package) driven by Playwright (`pip install playwright`: the Python package only, no browser
download) from the servers already running on 127.0.0.1. Nothing is committed: the pictures are for a person to
look at (a release note, a review of the UIs), and they show a particular run.

    mlflow ui --workers 1 --port 5055 --backend-store-uri sqlite:///DEMO/mlruns/mlflow.db &
    PREFECT_PORT=4250 make serve &       # in DEMO: its server also shows the demo's flow runs
    python docs/_hooks/ui_screenshots.py --out /tmp/shots --mlflow http://127.0.0.1:5055 --prefect http://127.0.0.1:4250

The IDs come from each server's REST API."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = [  # headless, and nothing that reaches out of this machine
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
ML = "?workflowType=machine_learning"  # the MLflow UI's model-training view (else its GenAI view)


def call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


Page = tuple[str, str | None]  # (URL, the tab to click once it is loaded, or None)


def mlflow_pages(base: str) -> dict[str, Page]:
    api = f"{base}/api/2.0/mlflow"
    found = call(f"{api}/experiments/search?max_results=100")["experiments"]
    experiments = {e["name"]: e["experiment_id"] for e in found}
    training = experiments["training"]
    runs = call(f"{api}/runs/search", {"experiment_ids": [training], "max_results": 1})["runs"]
    run_id = runs[0]["info"]["run_id"]
    models = call(f"{api}/registered-models/search?max_results=10").get("registered_models", [])
    run = f"{base}/#/experiments/{training}/runs/{run_id}"
    pages: dict[str, Page] = {
        "mlflow-experiments": (f"{base}/#/experiments{ML}", None),
        "mlflow-training": (f"{base}/#/experiments/{training}{ML}", None),
        "mlflow-training-run": (f"{run}{ML}", None),
        "mlflow-training-run-metrics": (f"{run}/model-metrics{ML}", None),
        "mlflow-training-run-timeline": (f"{run}/artifacts/timeline.png{ML}", None),
        "mlflow-plans": (f"{base}/#/experiments/{experiments['plans']}{ML}", None),
        "mlflow-models": (f"{base}/#/models", None),
    }
    if models:
        name = models[0]["name"]
        pages["mlflow-model"] = (f"{base}/#/models/{name}", None)
        version = (models[0].get("latest_versions") or [{}])[-1].get("version")
        if version:
            pages["mlflow-model-version"] = (f"{base}/#/models/{name}/versions/{version}", None)
    return pages


def prefect_pages(base: str) -> dict[str, Page]:
    api = f"{base}/api"
    pages: dict[str, Page] = {
        "prefect-deployments": (f"{base}/deployments", None),
        "prefect-runs": (f"{base}/runs", None),
    }
    for dep in call(f"{api}/deployments/filter", {"limit": 20}):
        if dep["name"] == "on-demand":  # train/on-demand: the training deployment
            pages["prefect-deployment-train"] = (f"{base}/deployments/deployment/{dep['id']}", None)
            pages["prefect-deployment-train-parameters"] = (f"{base}/deployments/deployment/{dep['id']}", "Parameters")
    done_runs = {"state": {"type": {"any_": ["COMPLETED"]}}}  # (not the scheduled runs of the deployments)
    runs = call(f"{api}/flow_runs/filter", {"limit": 50, "sort": "START_TIME_DESC", "flow_runs": done_runs})
    flows = {f["id"]: f["name"] for f in call(f"{api}/flows/filter", {"limit": 50})}
    for kind in ("pipeline", "train"):
        done = [r for r in runs if flows.get(r["flow_id"]) == kind and r["state_type"] == "COMPLETED"]
        if done:
            pages[f"prefect-flow-run-{kind}"] = (f"{base}/runs/flow-run/{done[0]['id']}", None)
            pages[f"prefect-flow-run-{kind}-artifacts"] = (f"{base}/runs/flow-run/{done[0]['id']}", "Artifacts")
    return pages


def shoot(pages: dict[str, Page], out: Path, chromium: str, size: tuple[int, int]) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS[1:])  # headless by default
        page = browser.new_page(viewport={"width": size[0], "height": size[1]})
        for name, (url, tab) in pages.items():
            page.goto(url, wait_until="load")  # (not "networkidle": both UIs poll their servers all the time)
            page.wait_for_timeout(3000)  # the pages draw after their data came
            if tab is not None:
                page.get_by_text(tab, exact=True).first.click()
                page.wait_for_timeout(2000)
            page.screenshot(path=str(out / f"{name}.png"))
            print(f"{out / (name + '.png')}  {url}" + (f"  (tab {tab})" if tab else ""))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mlflow", default="http://127.0.0.1:5055")
    parser.add_argument("--prefect", default="http://127.0.0.1:4250")
    parser.add_argument("--size", default="1600x1000", help="the viewport, WIDTHxHEIGHT")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium on PATH: install Debian's package (apt-get install chromium)")
    width, height = (int(v) for v in args.size.split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    pages = {**mlflow_pages(args.mlflow.rstrip("/")), **prefect_pages(args.prefect.rstrip("/"))}
    shoot(pages, args.out, chromium, (width, height))


if __name__ == "__main__":
    main()
