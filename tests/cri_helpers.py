"""Talking to a container runtime as the kubelet does (CRI), and reading what a container
really got (its cgroup's cpuset, its /proc status): shared by the runtime tests."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from criapi.runtime_v1 import api_pb2 as cri
from criapi.runtime_v1 import api_pb2_grpc as cri_grpc
from numalign.devcluster.images import WORKLOAD_IMAGE


def parse_list(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def cgroup_cpuset(pid: int) -> tuple[set[int], set[int]]:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(",") or controllers == "":
            base = Path("/sys/fs/cgroup/cpuset") if controllers else Path("/sys/fs/cgroup")
            d = base / path.lstrip("/")
            if (d / "cpuset.cpus").exists():
                eff = d / "cpuset.cpus"
                return (parse_list(eff.read_text()),
                        parse_list((d / "cpuset.mems").read_text()))
    raise AssertionError(f"no cpuset cgroup for pid {pid}")


def status_cpus(pid: int) -> set[int]:
    m = re.search(r"^Cpus_allowed_list:\s*(\S+)$", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert m
    return parse_list(m.group(1))


async def wait_until(cond: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Cri:
    def __init__(self, channel: grpc.aio.Channel, logs: Path, cgroup_parent: str) -> None:
        self.rt = cri_grpc.RuntimeServiceStub(channel)
        self.logs = logs
        self.cgroup_parent = cgroup_parent

    async def sandbox(self, name: str, uid: str = "", namespace: str = "t"
                      ) -> tuple[str, Any]:
        config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, uid=uid or str(uuid.uuid4()),
                                            namespace=namespace),
            log_directory=str(self.logs / name))
        config.linux.cgroup_parent = f"{self.cgroup_parent}/{name}"
        config.linux.security_context.namespace_options.network = cri.NODE
        (self.logs / name).mkdir(parents=True, exist_ok=True)
        resp = await self.rt.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60)
        return resp.pod_sandbox_id, config

    async def container(self, pod: tuple[str, Any], name: str,
                        annotations: dict[str, str] | None = None) -> str:
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name), image=cri.ImageSpec(image=WORKLOAD_IMAGE),
            log_path=f"{name}.log", annotations=annotations or {})
        resp = await self.rt.CreateContainer(cri.CreateContainerRequest(
            pod_sandbox_id=pod[0], config=config, sandbox_config=pod[1]), timeout=60)
        await self.rt.StartContainer(cri.StartContainerRequest(container_id=resp.container_id),
                                     timeout=60)
        return str(resp.container_id)

    async def remove_all_sandboxes(self) -> None:
        """Stop and remove every pod sandbox (and so its containers): a test's cleanup."""
        sandboxes = await self.rt.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=30)
        for sb in sandboxes.items:
            await self.rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sb.id),
                                         timeout=60)
            await self.rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sb.id),
                                           timeout=60)

    async def pid(self, cid: str) -> int:
        st = await self.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid,
                                                                      verbose=True), timeout=30)
        return int(json.loads(st.info["info"])["pid"])

    def printed_cpus(self, pod_name: str, name: str) -> set[int] | None:
        log = self.logs / pod_name / f"{name}.log"
        m = re.search(r"Cpus_allowed_list:\s*(\S+)", log.read_text()) if log.exists() else None
        return parse_list(m.group(1)) if m else None
