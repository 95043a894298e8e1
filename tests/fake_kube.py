"""An in-memory stand-in for the one client (numalign.api.kube.Kube) for unit tests of
the operator: objects by API path, answers and ApiErrors as the API server gives them
(404 for a missing object, 409 AlreadyExists on create, 409 Conflict on a stale
resourceVersion), events kept in order. ``refuse`` hooks refuse writes the way a quota
or a size limit does."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from numalign.api.kube import ApiError

Refuse = Callable[[str, str, dict[str, Any]], ApiError | None]  # method, path, body


def _is_collection(path: str) -> bool:
    """``/api/v1/RES``, ``/api/v1/namespaces/NS/RES`` (and the same under ``/apis/G/V``)."""
    segs = path.strip("/").split("/")
    depth = len(segs) - (2 if segs[0] == "api" else 3)
    return depth in (1, 3)


def _status(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {"kind": "Status", "code": code, "reason": reason, "message": message or reason}


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 1
        self.events: list[tuple[str, str]] = []  # (reason, message)
        self.created: list[str] = []  # names
        self.deleted: list[str] = []
        self.patches: list[tuple[str, Any]] = []
        self.refuse: list[Refuse] = []

    # -- helpers for tests
    def add(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.objects[f"{path}/{obj['metadata']['name']}"] = obj
        return obj

    def at(self, path: str) -> dict[str, Any]:
        return self.objects[path]

    def _check(self, method: str, path: str, body: dict[str, Any]) -> None:
        for hook in self.refuse:
            err = hook(method, path, body)
            if err is not None:
                raise err

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        return {**body, "metadata": {**body.get("metadata", {}),
                                     "resourceVersion": str(self.rv)}}

    def _children(self, path: str) -> list[dict[str, Any]]:
        prefix = path.rstrip("/") + "/"
        return [o for p, o in self.objects.items()
                if p.startswith(prefix) and "/" not in p[len(prefix):]]

    # -- the client's verbs
    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body["metadata"]["name"])
        key = f"{path.split('?')[0]}/{name}"
        if key in self.objects:
            raise ApiError(409, _status(409, "AlreadyExists"), "POST", path)
        self._check("POST", key, body)
        obj = self._stored(body)
        self.objects[key] = obj
        self.created.append(name)
        return obj

    async def get(self, path: str, params: Mapping[str, str] | None = None
                  ) -> dict[str, Any]:
        if path in self.objects:
            return self.objects[path]
        if _is_collection(path):
            items = self._children(path)
            if params and params.get("fieldSelector") == "status.phase=Failed":
                items = [i for i in items if (i.get("status") or {}).get("phase") == "Failed"]
            return {"items": items, "metadata": {"resourceVersion": str(self.rv)}}
        raise ApiError(404, _status(404, "NotFound"), "GET", path)

    async def get_or_none(self, path: str, params: Mapping[str, str] | None = None
                          ) -> dict[str, Any] | None:
        try:
            return await self.get(path, params)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list_all(self, path: str, params: Mapping[str, str] | None = None,
                       keep: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
                       ) -> tuple[list[dict[str, Any]], str]:
        doc = await self.get(path, params)
        items = list(doc.get("items") or [])
        if keep is not None:
            items = [k for k in map(keep, items) if k is not None]
        return items, str(self.rv)

    async def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        current = self.objects.get(path)
        if current is None:
            raise ApiError(404, _status(404, "NotFound"), "PUT", path)
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want and want != current["metadata"].get("resourceVersion"):
            raise ApiError(409, _status(409, "Conflict"), "PUT", path)
        self._check("PUT", path, body)
        obj = self._stored(body)
        self.objects[path] = obj
        return obj

    async def patch(self, path: str, body: Any, kind: str = "", *,
                    decode: bool = True) -> dict[str, Any]:
        if path not in self.objects:
            raise ApiError(404, _status(404, "NotFound"), "PATCH", path)
        self.patches.append((path, body))
        return self.objects[path]

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if path not in self.objects:
            raise ApiError(404, _status(404, "NotFound"), "DELETE", path)
        obj = self.objects.pop(path)
        self.deleted.append(str(obj["metadata"]["name"]))
        return obj

    async def event(self, obj: Mapping[str, Any], type_: str, *, reason: str, message: str,
                    component: str = "", instance: str | None = None) -> bool:
        self.events.append((reason, message))
        return True
