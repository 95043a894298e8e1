"""The log lines of numalign's daemons (operator, agent, extender): one line per message,
whatever a tenant wrote into the names, annotations and messages they quote (control
characters, line breaks and bidirectional overrides shown as escapes,
:func:`numalign.topology.text.printable`)."""

from __future__ import annotations

import logging
from types import TracebackType

from numalign.topology.text import printable

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_ExcInfo = (tuple[type[BaseException], BaseException, TracebackType | None]
            | tuple[None, None, None])


class PrintableFormatter(logging.Formatter):
    """A Formatter whose message is one printable line; tracebacks keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: _ExcInfo) -> str:
        return printable(super().formatException(ei), keep_newlines=True)

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), keep_newlines=True)


def configure(level: int, fmt: str = FORMAT) -> None:
    """``logging.basicConfig`` (so a no-op where the root logger has handlers already)
    with one stderr handler formatting through :class:`PrintableFormatter`."""
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
