"""Where a `mirasc explore` study lives (mirasc.lab.search): an Optuna storage given by URL — SQLite in the output
folder by default, any database URL, or a journal file — opened with the heartbeat that lets a crashed worker's trial
run again, and, for SQLite, a lock that makes `ask` one process at a time on one machine."""

from __future__ import annotations

import inspect
import os
import warnings
from pathlib import Path

from .cells import UsageError

MAX_RETRY = 3


def _optuna():
    try:
        import optuna
    except ImportError:
        raise UsageError("a study (--sampler, --study) needs Optuna: pip install 'mirasc[search]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def storage_url(opts: dict) -> str:
    return opts["study"] or f"sqlite:///{(Path(opts['out']) / 'study.db').resolve()}"


def journal_path(url: str) -> str | None:
    if url.startswith("journal:"):
        return url[len("journal:"):]
    if "://" not in url and url.endswith((".log", ".journal")):
        return url
    return None


def make_storage(url: str, heartbeat: int):
    """A journal file (JournalFileStorage) or a database (RDBStorage with a heartbeat: a trial whose worker has
    not been heard of for 2·heartbeat seconds is failed and enqueued again, up to MAX_RETRY times)."""
    optuna = _optuna()
    path = journal_path(url)
    if path is not None:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(path))
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) \
        or optuna.storages.RetryFailedTrialCallback
    params = inspect.signature(optuna.storages.RDBStorage).parameters
    callback = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params \
        else "failed_trial_callback"
    engine = {"connect_args": {"timeout": 300}} if url.startswith("sqlite") else {}
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine, heartbeat_interval=heartbeat,
                                          grace_period=2 * heartbeat, **{callback: retry(max_retry=MAX_RETRY)})
    except Exception as err:  # a bad URL, a missing driver, a database that cannot be reached
        raise UsageError(f"cannot open the study storage {url}: {type(err).__name__}: {err}") from None


class _FileLock:
    """An exclusive lock on a file (POSIX flock), for the processes of one machine."""

    def __init__(self, path: Path):
        self.path, self.file = path, None

    def __enter__(self):
        import fcntl

        self.file = open(self.path, "a")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        import fcntl

        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def _serialize_ask(study, url: str) -> None:
    """SQLite has no row locks: two processes could take the same waiting trial, or the same grid point. On one
    machine (SQLite's case) a lock file beside the database makes `ask` one process at a time."""
    if not url.startswith("sqlite:///") or os.name != "posix":
        return
    lock = _FileLock(Path(url[len("sqlite:///"):] + ".lock"))
    ask = study.ask

    def locked_ask(*args, **kwargs):
        with lock:
            return ask(*args, **kwargs)

    study.ask = locked_ask
