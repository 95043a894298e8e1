"""``numalign discover``: a machine's NUMA topology from sysfs (and nvidia-smi), as JSON or
as a machine file."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

import yaml

from numalign.agent.discovery import DiscoveryError, discover, machine_dict, to_machine
from numalign.topology.errors import MachineError

PROG = "numalign discover"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Discover NUMA nodes, CPUs, memory, hugepages, distances, PCI devices "
                    "and GPUs from sysfs under --root (the kubelet's semantics), and print "
                    "them as JSON or as a machine file.")
    p.add_argument("--root", default="/", metavar="DIR",
                   help="the directory holding sys/ (and proc/); default /")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--nvidia-smi", metavar="PATH", dest="nvidia_smi",
                     help="run this nvidia-smi for GPUs (default: nvidia-smi on PATH, and only "
                          "when --root is /)")
    gpu.add_argument("--no-gpus", action="store_true", help="do not look for GPUs")
    p.add_argument("--machine-yaml", action="store_true",
                   help="print a machine file (for --emulate and numalign admit) instead of "
                        "JSON")
    p.add_argument("--name", help="machine name in --machine-yaml (default: the host name, "
                                  "or the root directory's name)")
    p.add_argument("--pci-resource", action="append", default=[], metavar="ID=RESOURCE",
                   help="advertise PCI devices as RESOURCE in --machine-yaml; ID is "
                        "VENDOR:DEVICE (15b3:101b) or an address (0000:3b:00.0); repeatable")
    p.add_argument("--quiet", action="store_true", help="do not print warnings to stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    resources: dict[str, str] = {}
    for item in args.pci_resource:
        key, sep, res = item.partition("=")
        if not sep or not key.strip() or not res.strip():
            print(f"{PROG}: error: --pci-resource {item!r}: expected ID=RESOURCE, e.g. "
                  f"15b3:101b=example.com/nic", file=sys.stderr)
            return 2
        resources[key.strip()] = res.strip()
    try:
        dm = discover(args.root, nvidia_smi=args.nvidia_smi, gpus=not args.no_gpus)
        if args.machine_yaml:
            name = args.name or _default_name(args.root)
            to_machine(dm, name, pci_resources=resources)  # validate as a machine file
            out = yaml.safe_dump(machine_dict(dm, name, pci_resources=resources),
                                 sort_keys=False, default_flow_style=None, width=100)
        else:
            out = json.dumps(dm.to_json(), indent=2) + "\n"
    except (DiscoveryError, MachineError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        for w in dm.warnings:
            print(f"{PROG}: warning: {w}", file=sys.stderr)
    sys.stdout.write(out)
    return 0


def _default_name(root: str) -> str:
    p = Path(root)
    try:
        live = p.resolve() == Path("/")
    except OSError:
        live = False
    name = socket.gethostname() if live else p.resolve().name
    clean = "".join(ch if ch.isalnum() or ch in "-." else "-" for ch in name.lower())
    return clean.strip("-.") or "machine"
