"""A minimal HTTPS client for the dev cluster's own bootstrapping (readiness, the default
service account, CRD installation): the standard library only, so that ``numalign dev
up`` does not pay for importing the full Kubernetes client."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class Rest:
    def __init__(self, server: str, ca: Path | None, cert: Path | None = None,
                 key: Path | None = None, timeout: float = 5.0) -> None:
        self.server = server.rstrip("/")
        self.timeout = timeout
        if ca is None:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=str(ca))
        if cert is not None and key is not None:
            ctx.load_cert_chain(str(cert), str(key))
        self._ctx = ctx

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> tuple[int, Any]:
        """(HTTP status, decoded JSON or text); connection errors raise OSError."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=self.timeout) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, _decode(e.read())

    def get(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def ok(self, path: str) -> bool:
        """Whether GET ``path`` answers 200 (False on any error)."""
        try:
            return self.get(path)[0] == 200
        except (OSError, ValueError):
            return False


def _decode(raw: bytes) -> Any:
    text = raw.decode(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text
