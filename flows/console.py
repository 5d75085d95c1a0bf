"""What a flow run shows on the terminal: its own lines, not the engine's routine ones. Prefect's
console handler prints four lines for every watch-bucket poll (the run began, its URL, a task
finished, the run finished); the run's log in the Prefect API and UI keeps all of them."""
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
    from prefect.logging.handlers import PrefectConsoleHandler

    handlers = [h for name in ("", "prefect") for h in logging.getLogger(name).handlers]
    for handler in handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(isinstance(f, QuietRoutine) for f in handler.filters):
            handler.addFilter(QuietRoutine(flows))
