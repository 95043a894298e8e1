"""At creation ``numalign.io/resolved`` is the mutating webhook's to write: the admission
policy cannot tell a creator's value from the webhook's, so the webhook refuses a pod
that comes with its own, unless its creator is trusted (cluster admins, numalign's own
ServiceAccounts)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest

from numalign.api.names import ANN_RESOLVED
from numalign.controller import pods
from numalign.controller.pods import may_set_resolved, mutate_pod

TENANT = {"username": "jane", "groups": ["system:authenticated"]}


@pytest.mark.parametrize(("userinfo", "own", "trusted"), [
    ({"username": "admin", "groups": ["system:masters", "system:authenticated"]}, None, True),
    ({"username": "system:serviceaccount:numalign-system:numalign-operator",
      "groups": ["system:serviceaccounts", "system:serviceaccounts:numalign-system"]},
     "numalign-system", True),
    ({"username": "system:serviceaccount:team:default",
      "groups": ["system:serviceaccounts", "system:serviceaccounts:team"]},
     "numalign-system", False),
    ({"username": "system:serviceaccount:numalign-system:numalign-operator",
      "groups": ["system:serviceaccounts:numalign-system"]}, None, False),
    (TENANT, "numalign-system", False),
    (None, "numalign-system", False),
])
def test_who_may_bring_its_own_resolved(userinfo: dict[str, Any] | None, own: str | None,
                                        trusted: bool, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    if own is None:
        monkeypatch.delenv("POD_NAMESPACE", raising=False)
    else:
        monkeypatch.setenv("POD_NAMESPACE", own)
    assert may_set_resolved(userinfo) is trusted


def test_the_webhook_refuses_a_tenants_resolved_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def must_not_resolve(*_: Any) -> None:
        raise AssertionError("a refused pod is not resolved")

    monkeypatch.setattr(pods, "resolve_pod", must_not_resolve)
    body = kopf.Body({"metadata": {"name": "p", "namespace": "team",
                                   "annotations": {ANN_RESOLVED: '{"policy":"none"}'}},
                      "spec": {"containers": [{"name": "c"}]}})
    with pytest.raises(kopf.AdmissionError) as refused:
        asyncio.run(mutate_pod(body=body, patch=kopf.Patch(), dryrun=False,
                               logger=logging.getLogger("test"), userinfo=TENANT))
    assert str(refused.value).startswith(f"{ANN_RESOLVED} is numalign's: only its operator "
                                         "and agents may set it, not jane")
    assert refused.value.code == 403
