"""Screenshots of a finished study in the MLflow UI and optuna-dashboard (evidence, not a test).

Serves the study's two stores on 127.0.0.1 only (``mlflow server`` and ``optuna-dashboard``),
takes PNGs with headless Chromium (Debian's ``chromium`` package), stops both servers, and
writes ``benchmarks/results/*.png`` (ignored by git). Prints one line per PNG.

    python benchmarks/screenshots.py --dir /tmp/shots --study tiny-shots

``--dir`` holds ``allocopt.db`` (Optuna) and ``mlflow.db`` (MLflow) of a finished study, as
``allocopt study`` leaves them in the folder it ran in. Needs: ``apt-get install chromium``,
``pip install optuna-dashboard``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(port: int, seconds: float = 400) -> None:
    end = time.time() + seconds
    while time.time() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise SystemExit(f"port {port}: no server after {seconds:.0f} s")


def _shot(url: str, png: Path, width: int = 1500, height: int = 950, wait_ms: int = 15000) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("chromium: not installed (apt-get install -y chromium)")
    for attempt in range(3):  # a first load on busy cores can hang: kill it and try again
        try:
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--window-size={width},{height}", f"--virtual-time-budget={wait_ms}",
                            f"--screenshot={png}", url], check=True, capture_output=True, timeout=90)
            print(f"{png}  <- {url}")
            return
        except subprocess.TimeoutExpired:
            print(f"{png}: chromium timed out (try {attempt + 1})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, type=Path, help="folder with allocopt.db and mlflow.db")
    ap.add_argument("--study", required=True, help="study name")
    ap.add_argument("--prefix", default="", help="prefix of the PNG names")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    folder = a.dir.resolve()
    from mlflow import MlflowClient

    mlflow_uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name(f"allocopt/{a.study}")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    parent = next(r for r in runs if r.data.tags.get("allocopt.role") == "study")
    trial = next((r for r in runs if r.data.tags.get("allocopt.state") == "COMPLETE"), None)
    import optuna

    study_id = optuna.load_study(study_name=a.study, storage=f"sqlite:///{folder / 'allocopt.db'}")._study_id

    p_ml, p_od = _free_port(), _free_port()
    env = {**os.environ, "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                          "--port", str(p_ml), "--workers", "1", "--backend-store-uri", mlflow_uri],
                         cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=open(OUT / "mlflow_server.log", "w")),
        subprocess.Popen(["optuna-dashboard", "--host", "127.0.0.1", "--port", str(p_od),
                          f"sqlite:///{folder / 'allocopt.db'}"],
                         cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    try:
        _wait(p_ml)
        _wait(p_od)
        import urllib.request

        for port in (p_ml, p_od):  # the port is open before the app answers
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=300).read()
        ml = f"http://127.0.0.1:{p_ml}"
        od = f"http://127.0.0.1:{p_od}"
        pre = a.prefix
        # ?workflowType=machine_learning: MLflow 3.17's UI otherwise opens on its GenAI overview
        _shot(f"{ml}/#/experiments/{exp.experiment_id}?workflowType=machine_learning",
              OUT / f"{pre}mlflow_experiment.png")
        _shot(f"{ml}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning",
              OUT / f"{pre}mlflow_parent_run.png", height=1400)
        _shot(f"{ml}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}/artifacts?workflowType=machine_learning",
              OUT / f"{pre}mlflow_parent_artifacts.png")
        if trial is not None:
            _shot(f"{ml}/#/experiments/{exp.experiment_id}/runs/{trial.info.run_id}/model-metrics?workflowType=machine_learning",
                  OUT / f"{pre}mlflow_trial_metrics.png", height=1600)
        _shot(f"{od}/dashboard/studies/{study_id}", OUT / f"{pre}optuna_dashboard_study.png", height=1400)
        _shot(f"{od}/dashboard/studies/{study_id}/trials", OUT / f"{pre}optuna_dashboard_trials.png")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
