"""What a flow run shows on the terminal: its own lines, not the engine's routine ones. Prefect's
console handler prints four lines for every watch-bucket poll (the run began, its URL, a task
finished, the run finished), and a stage's one-line error twice more as a traceback (the task's
failure and the flow's); the run's log in the Prefect API and UI keeps all of them."""
from __future__ import annotations

import logging

ROUTINE = ("Beginning flow run", "View at ", "Finished in state Completed", "Created task run", "Executing '")


class QuietRoutine(logging.Filter):
    """Drops the engine's routine INFO lines of the named flows' runs and their tasks."""

    def __init__(self, flows: tuple[str, ...]):
        super().__init__()
        self.flows = flows

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "flow_name", None) not in self.flows or record.levelno > logging.INFO:
            return True
        return not record.getMessage().startswith(ROUTINE)


def quiet_console(*flows: str) -> None:
    """Installs QuietRoutine on the console handlers Prefect configured (once each)."""
    for handler in _console_handlers():
        if not any(isinstance(f, QuietRoutine) for f in handler.filters):
            handler.addFilter(QuietRoutine(flows))


class QuietFailures(logging.Formatter):
    """Formats the records of the named flows' runs whose exception is one of `errors` (an error that is
    its own one line, a stage's) without their traceback: the message still names the exception. Wraps
    the console handler's formatter and formats a copy of the record, so the API handler, which formats
    the record itself, keeps the traceback in the run's log."""

    def __init__(self, inner: logging.Formatter | None, flows: tuple[str, ...], errors: tuple[type[BaseException], ...]):
        super().__init__()
        self.inner, self.flows, self.errors = inner or logging.Formatter(), flows, errors

    def format(self, record: logging.LogRecord) -> str:
        if (record.exc_info and isinstance(record.exc_info[1], self.errors)
                and getattr(record, "flow_name", None) in self.flows):
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        return self.inner.format(record)


def quiet_failures(*flows: str, errors: tuple[type[BaseException], ...]) -> None:
    """Installs QuietFailures on the console handlers Prefect configured (once each)."""
    for handler in _console_handlers():
        if not isinstance(handler.formatter, QuietFailures):
            handler.setFormatter(QuietFailures(handler.formatter, flows, errors))


class QuietRestatedFailures(logging.Filter):
    """Drops the engine's lines that restate the named flows' failure, for a command that ends with the
    failure's one line itself (`stoke run`): the tasks' and the flow's "Finished in state Failed(...)", and
    the records of an exception that is its own one line (a stage's). A failure of another kind keeps its
    traceback; the run's log in the Prefect API keeps every line."""

    def __init__(self, flows: tuple[str, ...], errors: tuple[type[BaseException], ...]):
        super().__init__()
        self.flows, self.errors = flows, errors

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "flow_name", None) not in self.flows:
            return True
        if record.exc_info and isinstance(record.exc_info[1], self.errors):
            return False
        return not record.getMessage().startswith("Finished in state Failed")


def quiet_restated_failures(*flows: str, errors: tuple[type[BaseException], ...]) -> None:
    """Installs QuietRestatedFailures on the console handlers Prefect configured (once each)."""
    for handler in _console_handlers():
        if not any(isinstance(f, QuietRestatedFailures) for f in handler.filters):
            handler.addFilter(QuietRestatedFailures(flows, errors))


def _console_handlers() -> list[logging.Handler]:
    from prefect.logging.handlers import PrefectConsoleHandler

    return [h for name in ("", "prefect") for h in logging.getLogger(name).handlers if isinstance(h, PrefectConsoleHandler)]


def console_of_logs():
    """The rich console Prefect's console handler prints the run's lines through, or None: a progress bar on it
    keeps below those lines (flows/reporting.py)."""
    return next((handler.console for handler in _console_handlers() if hasattr(handler, "console")), None)
