"""``python tests/fault_operator.py POINT ARGS...`` runs ``numalign ARGS...`` and exits
abruptly (``os._exit``, as a kill would) when a redeploy step reaches the checkpoint
POINT (``after-record``: the decision is durable; ``after-create``: the replacement
exists). The restart tests use it; the product has only the no-op checkpoint."""

from __future__ import annotations

import logging
import os
import sys

from numalign import cli
from numalign.controller.redeploy import rejected


def main(argv: list[str]) -> int:
    point, args = argv[0], argv[1:]

    def crash(at: str) -> None:
        if at == point:
            logging.getLogger(__name__).error(f"injected fault at {point}: exiting")
            os._exit(17)

    rejected.checkpoint = crash
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
