"""Screenshots of a finished study in the MLflow UI and optuna-dashboard (evidence, not a test).

Serves the study's two stores on 127.0.0.1 only (``mlflow server`` and ``optuna-dashboard``),
takes PNGs with headless Chromium (Debian's ``chromium`` package), stops both servers, and
writes ``benchmarks/results/*.png`` (ignored by git). Prints one line per PNG.

    python benchmarks/screenshots.py --dir /tmp/shots --study tiny-shots

``--dir`` holds ``allocopt.db`` (Optuna) and ``mlflow.db`` (MLflow) of a finished study, as
``allocopt study`` leaves them in the folder it ran in. Needs: ``apt-get install chromium``,
``pip install optuna-dashboard websocket-client`` (both in the ``dev`` extra).
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


class _Browser:
    """Headless Chromium driven over the DevTools protocol (``websocket-client``): a page is
    given real seconds to render (MLflow draws its charts after its data arrives, which
    ``--virtual-time-budget`` does not wait for), then a script may click (close MLflow's
    assistant panel, expand the study's parent run) before the PNG is taken."""

    def __init__(self) -> None:
        import tempfile
        import urllib.request

        import websocket  # websocket-client

        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        if browser is None:
            raise SystemExit("chromium: not installed (apt-get install -y chromium)")
        self.port = _free_port()
        self.profile = tempfile.mkdtemp(prefix="shots-chromium-")
        self.proc = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                      f"--remote-debugging-port={self.port}", f"--user-data-dir={self.profile}",
                                      "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.time() + 120
        while True:
            try:
                import json

                tabs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json", timeout=5).read())
                self.version = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/version",
                                                                 timeout=5).read())
                break
            except OSError:
                if time.time() > end:
                    raise SystemExit("chromium: no DevTools endpoint after 120 s")
                time.sleep(0.5)
        page = next(t for t in tabs if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=300, suppress_origin=True)
        self.n = 0

    def call(self, method: str, **params: object) -> dict:
        import json

        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                return msg.get("result", {})

    def shot(self, url: str, png: Path, width: int = 1900, height: int = 1000, wait_s: float = 8,
             ready: str = "true", script: str = "") -> None:
        """Load ``url`` at ``width`` x ``height`` CSS pixels, wait until the JavaScript
        expression ``ready`` is true (at most 180 s; a cold server on busy cores is slow), then
        ``wait_s`` seconds more, run ``script`` (JavaScript; then 4 s more), write ``png``."""
        import base64

        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=url)
        end = time.time() + 180
        while time.time() < end:
            time.sleep(1)
            got = self.call("Runtime.evaluate", expression=f"Boolean({ready})", returnByValue=True)
            if got.get("result", {}).get("value") is True:
                break
        else:
            print(f"{png}: not ready after 180 s ({ready})")
        time.sleep(wait_s)
        if script:
            self.call("Runtime.evaluate", expression=script)
            time.sleep(4)
        png.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        print(f"{png}  <- {url}")

    def close(self) -> None:
        import websocket

        try:
            ws = websocket.create_connection(self.version["webSocketDebuggerUrl"], timeout=20, suppress_origin=True)
            ws.send('{"id": 1, "method": "Browser.close"}')
            ws.close()
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.ws.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


# MLflow 3.17's assistant panel covers a quarter of every page: close it
CLOSE_ASSISTANT = ("[...document.querySelectorAll('button')].filter(b => b.getAttribute('aria-label') === 'Close')"
                   ".forEach(b => b.click());")
# the runs table nests the trials under the study's parent run, collapsed: open it
EXPAND_PARENT = ("document.querySelectorAll('[data-component-id*=\"runnamecellrenderer\"]')"
                 ".forEach(b => b.click());")


def _has_text(text: str) -> str:
    """JavaScript: true once the page shows ``text``."""
    return f"document.body && document.body.innerText.includes({text!r})"


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
    # the trial to show: the best full-budget one (the parent's allocopt.best.trial), else the
    # first complete full-budget one, else (a study stopped during its pilots) the first pilot
    best = parent.data.tags.get("allocopt.best.trial")
    done = [r for r in runs if r.data.tags.get("allocopt.state") == "COMPLETE"]
    full = [r for r in done if r.data.tags.get("allocopt.fidelity", "full") == "full"]
    trial = next((r for r in full if r.data.tags.get("allocopt.trial_number") == best), (full or done or [None])[0])
    import optuna

    st = optuna.load_study(study_name=a.study, storage=f"sqlite:///{folder / 'allocopt.db'}")
    study_id = st._study_id
    infeasible = [t.number for t in st.get_trials(deepcopy=False) if t.user_attrs.get("state") == "INFEASIBLE"]
    best_number = int(best) if best is not None and str(best).isdigit() else None

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
        b = _Browser()
        try:
            # ?workflowType=machine_learning: MLflow 3.17's UI otherwise opens on its GenAI overview
            q = "?workflowType=machine_learning"
            base = f"{ml}/#/experiments/{exp.experiment_id}"
            b.shot(f"{base}{q}", OUT / f"{pre}mlflow_experiment.png", ready="document.querySelector('.ag-row')",
                   script=CLOSE_ASSISTANT + EXPAND_PARENT)
            b.shot(f"{base}/runs/{parent.info.run_id}{q}", OUT / f"{pre}mlflow_parent_run.png", height=1500,
                   ready=_has_text("Metrics ("), script=CLOSE_ASSISTANT)
            b.shot(f"{base}/runs/{parent.info.run_id}/artifacts/regime_table.txt{q}",
                   OUT / f"{pre}mlflow_parent_artifacts.png", ready=_has_text("RACE regimes"), script=CLOSE_ASSISTANT)
            if trial is not None:
                b.shot(f"{base}/runs/{trial.info.run_id}/model-metrics{q}", OUT / f"{pre}mlflow_trial_metrics.png",
                       height=1600, wait_s=25, ready=_has_text("Model metrics"), script=CLOSE_ASSISTANT)
            b.shot(f"{od}/dashboard/studies/{study_id}", OUT / f"{pre}optuna_dashboard_study.png", height=1500,
                   ready=_has_text("History"))
            # the trials page on an infeasible plan when there is one, else on the best trial
            shown = infeasible[0] if infeasible else best_number
            b.shot(f"{od}/dashboard/studies/{study_id}/trials" + (f"?numbers={shown}" if shown is not None else ""),
                   OUT / f"{pre}optuna_dashboard_trials.png", ready=_has_text("Trial 0"))
        finally:
            b.close()
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
