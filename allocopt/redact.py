"""Passwords out of everything printed or written: storage and tracking URLs redacted.

Standard library only. Every line allocopt prints and every file it writes shows a URL through
:func:`redact_url`; commands written for later (``ask.json``'s ``tell``) carry no password at
all (:func:`without_password`) and name the variable the client reads it from.
"""

from __future__ import annotations


def redact_url(url: str | None) -> str:
    """``url`` with its password replaced by ``***``; safe to print and to log.

    ``postgresql://user:secret@host:5432/db`` -> ``postgresql://user:***@host:5432/db``; a
    ``password=`` query parameter is redacted too. URLs without a password are returned as is.

    >>> redact_url("postgresql+psycopg://al:s3cr@t@db.example:5432/optuna?password=x&sslmode=require")
    'postgresql+psycopg://al:***@db.example:5432/optuna?password=***&sslmode=require'
    """
    if not url:
        return "" if url is None else url
    import re

    s = str(url)
    if not re.search(r"\s", s):
        s = _redact_one(s)
    else:  # a message that holds URLs (an error line): each one redacted
        s = re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"()<>]+", lambda m: _redact_one(m.group(0)), s)
    return re.sub(r"(?i)([?&;]password=)[^&;\s'\"]*", r"\1***", s)


def without_password(url: str) -> tuple[str, str | None]:
    """``url`` with no password at all, for commands written to files (``ask.json``'s ``tell``),
    and the variable that supplies it instead: ``PGPASSWORD`` (or ``~/.pgpass``, read by libpq)
    for PostgreSQL, ``MLFLOW_TRACKING_PASSWORD`` (with ``MLFLOW_TRACKING_USERNAME``, read by
    MLflow) for an ``http(s)`` server; ``None`` when the URL held no password.

    >>> without_password("postgresql+psycopg://al:s3cr@db:5432/optuna")
    ('postgresql+psycopg://al@db:5432/optuna', 'PGPASSWORD')
    """
    shown = redact_url(url)
    if shown == url:
        return url, None
    import re

    bare = re.sub(r"(?i)[?&;]password=\*\*\*", "", shown.replace(":***@", "@", 1))
    if url.startswith(("http://", "https://")):
        bare = re.sub(r"://[^/@]*@", "://", bare, count=1)
        return bare, "MLFLOW_TRACKING_PASSWORD"
    return bare, "PGPASSWORD" if url.startswith("postgres") else "the database's password variable"


def _redact_one(s: str) -> str:
    scheme, sep, rest = s.partition("://")
    if sep:
        cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0] or [len(rest)])
        netloc, tail = rest[:cut], rest[cut:]
        # the password may itself hold an unescaped '@': the host follows the last one
        userinfo, at, host = netloc.rpartition("@")
        if at and ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        s = f"{scheme}://{userinfo}{at}{host}{tail}" if at else s
    return s
