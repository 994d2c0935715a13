"""A password in a storage or MLflow URL never reaches a printed line or a written file.

One parametrized test over the commands that take a URL, with a sentinel password, against
servers that do not answer (a closed loopback port): stdout, stderr and every file under
``tmp_path`` are scanned. Plus the line a study prints for its MLflow runs, and the ``tell``
command ``ask.json`` holds (written without the password; the variable to set is named).
"""

import pytest

SECRET = "Zq9SENTINELpw"
PG = f"postgresql+psycopg://u:{SECRET}@127.0.0.1:9/db"
HTTP = f"http://u:{SECRET}@127.0.0.1:9"
STUDY = ["--objective", "synthetic", "--budget", "1e18", "--target", "pass@1"]

COMMANDS = {
    "study-mlflow": ["study", *STUDY, "--pilots", "0", "--trials", "1", "--storage", "sqlite:///{tmp}/o.db",
                     "--mlflow-uri", HTTP],
    "study-storage": ["study", *STUDY, "--pilots", "0", "--trials", "1", "--storage", PG, "--no-mlflow"],
    "race-mlflow": ["race", *STUDY, "--storage", "sqlite:///{tmp}/o.db", "--mlflow-uri", HTTP],
    "best-from-mlflow": ["best", "--from-mlflow", "s", "--mlflow-uri", HTTP],
    "pareto-from-mlflow": ["pareto", "--from-mlflow", "s", "--mlflow-uri", HTTP],
    "report-from-mlflow": ["report", "--out", "{tmp}/r", "--from-mlflow", "s", "--mlflow-uri", HTTP],
    "best-storage": ["best", "--study", "s", "--storage", PG],
    "ask-storage": ["ask", *STUDY, "--study", "s", "--storage", PG, "--out", "{tmp}/asked"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_password_is_never_printed_or_written(name, cli, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in COMMANDS[name]]
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)  # the server does not answer: one line
    assert "***" in r.stderr and "Traceback" not in r.stderr
    assert SECRET not in r.stdout + r.stderr
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f


def test_the_mlflow_link_at_the_end_of_a_study_has_no_password():
    from types import SimpleNamespace

    from allocopt.cli.study import mlflow_lines

    lines = mlflow_lines(SimpleNamespace(tracking_uri=f"https://al:{SECRET}@mlflow.example:5000", experiment_id="7"))
    assert lines == ["MLflow runs: https://mlflow.example:5000/#/experiments/7?workflowType=machine_learning"]


def test_written_commands_carry_no_password_and_name_the_variable():
    from allocopt.redact import redact_url, without_password

    assert without_password(PG) == ("postgresql+psycopg://u@127.0.0.1:9/db", "PGPASSWORD")
    assert without_password(HTTP) == ("http://127.0.0.1:9", "MLFLOW_TRACKING_PASSWORD")
    assert without_password("sqlite:///o.db") == ("sqlite:///o.db", None)
    # a URL inside an error message (MLflow's "API request to URL failed ...") is redacted too
    msg = f"API request to {HTTP}/api/2.0/mlflow/runs/get failed with exception X"
    assert redact_url(msg) == "API request to http://u:***@127.0.0.1:9/api/2.0/mlflow/runs/get failed with exception X"
