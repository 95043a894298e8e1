"""Install the numalign CRDs into a cluster and wait until they are Established; with
them, where the repository's ``config/nrt/crd.yaml`` is at hand, the NodeResourceTopology
CRD the dev cluster's agents publish (``--publish-nrt``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from ..api.kube import ApiError, SyncKube

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NRT_CRD = Path(__file__).resolve().parents[3] / "config" / "nrt" / "crd.yaml"


class CrdError(RuntimeError):
    pass


def load_crds(crd_dir: Path | None = None) -> list[dict[str, Any]]:
    """The CRDs in ``crd_dir``'s YAML files, or (None) the ones generated from the models
    and the NodeResourceTopology CRD (``NRT_CRD``, when the repository is at hand)."""
    if crd_dir is None:
        from ..api.crdgen import crds

        out = crds()
        if NRT_CRD.is_file():
            out += [d for d in yaml.safe_load_all(NRT_CRD.read_text()) if isinstance(d, dict)]
        return out
    docs: list[dict[str, Any]] = []
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                docs.append(doc)
    if not docs:
        raise CrdError(f"no CustomResourceDefinition in {crd_dir}/*.yaml")
    return docs


def _established(obj: Any) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or [] if isinstance(obj, dict) else []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)


def create_or_replace(kube: SyncKube, collection: str, obj: dict[str, Any]) -> None:
    """Create ``obj`` in ``collection`` (an API path), or replace the one of its name."""
    name = obj["metadata"]["name"]
    try:
        kube.create(f"{collection}?fieldValidation=Strict", obj)
    except ApiError as e:
        if e.status != 409:
            raise
        current = kube.get(f"{collection}/{quote(name)}")
        update = dict(obj)
        update["metadata"] = {**obj["metadata"],
                              "resourceVersion": current["metadata"]["resourceVersion"]}
        kube.put(f"{collection}/{quote(name)}?fieldValidation=Strict", update)


def apply_crd(kube: SyncKube, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    try:
        create_or_replace(kube, CRD_PATH, crd)
    except ApiError as e:
        raise CrdError(f"installing CRD {name}: HTTP {e.status}: {e.message}") from e


def install_crds(kube: SyncKube, crd_dir: Path | None = None,
                 log: Callable[[str], None] | None = None, timeout: float = 60.0) -> list[str]:
    """Create or update every CRD, then wait until each is Established; return names."""
    docs = load_crds(crd_dir)
    for crd in docs:
        apply_crd(kube, crd)
    names = [d["metadata"]["name"] for d in docs]
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        pending = [n for n in pending
                   if not _established(kube.get_quiet(f"{CRD_PATH}/{quote(n)}"))]
        if not pending:
            break
        if time.monotonic() > deadline:
            raise CrdError(f"CRDs not Established after {timeout:.0f}s: {', '.join(pending)}")
        time.sleep(0.1)
    if log:
        log(f"CRDs installed and Established: {', '.join(names)}")
    return names
