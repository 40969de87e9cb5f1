"""What a `specroute` command shows: the user's own progress, and specroute's notes as one line each.

Third-party libraries print a lot a user did not ask for: transformers' "Converting and de-quantizing GGUF
tensors", "Loading weights" and "Writing model shards" bars (several per stage), its log warnings, Lightning's
banner lines, other libraries' `warnings`. `command_output` (the command line wraps every command in it) sends
all of that to a log file and names the file at the end; specroute's own `warnings.warn` notes print as
`[specroute] note: ...`, one line each, instead of a `UserWarning` with a source path and code line.
`third_party()` goes around calls into libraries that print their own bars (model loading, conversion):
inside a command their output goes to the log; outside one (Python users, tests) nothing changes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from pathlib import Path

PROJECT_PACKAGES = ("router", "data_gen", "train", "eval", "specroute")
THIRD_PARTY_LOGGERS = ("transformers", "lightning", "lightning.pytorch", "lightning.fabric", "datasets", "torch")
_ACTIVE: list = []  # the log file of the running command (a stack: commands may nest, e.g. the demo's stages)


def _source_root() -> Path:
    return Path(__file__).resolve().parents[2]  # the folder holding router/, data_gen/, ...


def is_project_file(filename: str) -> bool:
    """True when a warning was raised by specroute's own code (not a library's)."""
    try:
        relative = Path(filename).resolve().relative_to(_source_root())
    except (ValueError, OSError):
        return False
    return bool(relative.parts) and relative.parts[0] in PROJECT_PACKAGES


def log_folder() -> Path:
    return Path(os.environ.get("SPECROUTE_CACHE", Path.home() / ".cache" / "specroute")) / "logs"


class _Log:
    """The command's third-party log: opened on first write, so a quiet command leaves no file."""

    def __init__(self, path: Path):
        self.path, self.lines, self._file = path, 0, None
        self.routing = _Routing(self)

    def write(self, text: str) -> int:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        self.lines += text.count("\n")
        return self._file.write(text)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def isatty(self) -> bool:  # progress bars asking whether they draw on a terminal: they do not
        return False

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _show_warning(log: _Log):
    def show(message, category, filename, lineno, file=None, line=None):
        if is_project_file(filename):
            print(f"[specroute] note: {message}", file=sys.stderr, flush=True)
        else:
            log.write(warnings.formatwarning(message, category, filename, lineno, line))

    return show


class _Routing:
    """Third-party loggers write into the log instead of the terminal, for the command's duration. A library
    imported during the command adds its terminal handler then (Lightning does, on import): `reroute` takes
    those over too. `restore` puts back every handler as it was before the command."""

    def __init__(self, log: _Log):
        self.handler = logging.StreamHandler(log)
        self.handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        self.saved: dict = {}  # logger -> (its handlers before the command, propagate)

    def reroute(self) -> None:
        for name in THIRD_PARTY_LOGGERS:
            logger = logging.getLogger(name)
            if logger not in self.saved:
                self.saved[logger] = (logger.handlers[:], logger.propagate)
            logger.handlers = [self.handler]
            logger.propagate = False

    def restore(self) -> None:
        for logger, (handlers, propagate) in self.saved.items():
            logger.handlers, logger.propagate = handlers, propagate


def reroute() -> None:
    """Call after importing a library that adds its own terminal handler on import (Lightning): inside a
    command its log lines then go to the command's log too; outside one, nothing changes."""
    if _ACTIVE:
        _ACTIVE[-1].routing.reroute()


def import_datasets():
    """`datasets`, imported so that inside a command its log lines (it adds a terminal handler on import, e.g.
    "Failed to load JSON from file ...") go to the command's log like every other library's."""
    import datasets

    reroute()
    return datasets


# (module, its off and on switches, the environment variable it reads on import)
_BARS = (
    ("transformers.utils.logging", "disable_progress_bar", "enable_progress_bar", "HF_HUB_DISABLE_PROGRESS_BARS"),
    ("huggingface_hub.utils", "disable_progress_bars", "enable_progress_bars", "HF_HUB_DISABLE_PROGRESS_BARS"),
    ("datasets.utils.logging", "disable_progress_bar", "enable_progress_bar", "HF_DATASETS_DISABLE_PROGRESS_BARS"),
)


def _bars_off() -> list:
    """Turn off the progress bars of transformers, huggingface_hub and datasets; returns how to undo it. A library
    already imported is switched off; one not imported yet is not imported here (that would cost every command,
    `specroute rules` included, seconds): the environment variable it reads on import starts it without bars."""
    undo = []
    for module, off, on, env in _BARS:
        if module in sys.modules:
            getattr(sys.modules[module], off)()
            undo.append(getattr(sys.modules[module], on))
        elif env not in os.environ:
            os.environ[env] = "1"
            undo.append(lambda env=env: os.environ.pop(env, None))
    return undo


@contextlib.contextmanager
def command_output(command: str):
    """Around one `specroute` command: third-party output to a log file (named at the end when anything
    went there), specroute's notes as one line each. Yields the log."""
    if _ACTIVE:  # a command inside a command (the demo's stages): one log for the whole run
        yield _ACTIVE[-1]
        return
    log = _Log(log_folder() / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    previous = warnings.showwarning
    warnings.showwarning = _show_warning(log)
    undo = _bars_off()
    log.routing.reroute()
    _ACTIVE.append(log)
    try:
        yield log
    finally:
        _ACTIVE.pop()
        log.routing.restore()
        warnings.showwarning = previous
        for on in undo:
            on()
        log.close()
        if log.lines:
            print(f"[specroute] third-party messages ({log.lines} lines) are in {log.path}", file=sys.stderr)


@contextlib.contextmanager
def third_party():
    """Around a call into a library that prints its own bars or notes: inside a command, its stdout and stderr
    go to the command's log; outside one, nothing changes."""
    if not _ACTIVE:
        yield
        return
    with contextlib.redirect_stderr(_ACTIVE[-1]), contextlib.redirect_stdout(_ACTIVE[-1]):
        yield
