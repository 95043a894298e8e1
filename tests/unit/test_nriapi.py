"""numalign.nriapi: the generated NRI and ttrpc messages are current and speak the protocol."""

from __future__ import annotations

from pathlib import Path

import pytest

from numalign.nriapi import generate
from numalign.nriapi.ttrpc import request_pb2
from numalign.nriapi.v1alpha1 import api_pb2


def test_generated_modules_are_current(tmp_path: Path) -> None:
    # Go is required by the test command: no protos is a broken setup, not a skip.
    generate.generate(tmp_path, generate.module_dirs())
    assert generate.stale(generate.PACKAGE_DIR.parent.parent, tmp_path) == []


def test_stale_names_a_changed_file(tmp_path: Path) -> None:
    root = generate.PACKAGE_DIR.parent.parent
    for rel in generate.generated_files():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((root / rel).read_bytes())
    assert generate.stale(root, tmp_path) == []
    changed = tmp_path / "numalign" / "nriapi" / "ttrpc" / "request_pb2.py"
    changed.write_text(changed.read_text() + "# edited\n")
    assert generate.stale(root, tmp_path) == [
        str(Path("numalign", "nriapi", "ttrpc", "request_pb2.py"))]


def test_bad_source_folder_is_a_clear_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--check", "--nri-source", str(tmp_path),
                          "--ttrpc-source", str(tmp_path)]) == 2
    assert "pkg/api/api.proto: no such proto" in capsys.readouterr().err


def test_ttrpc_status_is_wire_identical_to_google_rpc_status() -> None:
    # google.rpc.Status{code=5, message="gone"} as the Go runtime encodes it
    wire = bytes([0x0A, 0x08, 0x08, 0x05, 0x12, 0x04]) + b"gone" + bytes([0x12, 0x01, 0x78])
    resp = request_pb2.Response.FromString(wire)
    assert (resp.status.code, resp.status.message, resp.payload) == (5, "gone", b"x")


def test_nri_services_and_messages() -> None:
    plugin = api_pb2.DESCRIPTOR.services_by_name["Plugin"]
    assert plugin.full_name == "nri.pkg.api.v1alpha1.Plugin"
    assert {"Configure", "Synchronize", "CreateContainer", "StateChange"} <= set(
        plugin.methods_by_name)
    runtime = api_pb2.DESCRIPTOR.services_by_name["Runtime"]
    assert set(runtime.methods_by_name) == {"RegisterPlugin", "UpdateContainers"}
    adj = api_pb2.ContainerAdjustment()
    adj.linux.resources.cpu.cpus = "1-2"
    adj.linux.resources.cpu.mems = "0"
    again = api_pb2.CreateContainerResponse.FromString(
        api_pb2.CreateContainerResponse(adjust=adj).SerializeToString())
    assert again.adjust.linux.resources.cpu.cpus == "1-2"
