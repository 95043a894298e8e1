"""The ``numalign`` command: one subcommand per module in ``numalign.commands`` (``-`` in a
command's name is ``_`` in its module's), but ``dev``, whose module is in the development
install only (``numalign.devcluster``: not in the runtime wheel)."""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, str] = {
    "merge": "merge JSON lines of provider hints as the Topology Manager does",
    "admit": "admit pods in order against a machine file",
    "discover": "discover a machine's NUMA topology from sysfs",
    "explain": "show why a pod got its NUMA affinity",
    "agent": "run the node agent (real node or emulated nodes)",
    "operator": "run the operator (Kopf)",
    "extender": "run the kube-scheduler extender (places pods by their own policy)",
    "extender-certs": "write the extender's and kube-scheduler's TLS certificates",
    "dev": "local control plane for the demo and the tests (up, down, kubeconfig)",
}
# Long-running commands load the policy plugins (NUMALIGN_POLICY_MODULES, the
# numalign.policies entry points) at start, so that a bad one stops them at once; the
# others load them only when a policy name is not a built-in one.
LOADS_PLUGINS = frozenset({"agent", "operator", "extender"})


# Subcommands whose module is not numalign.commands.<name>: the development install's.
MODULES: dict[str, str] = {"dev": "numalign.devcluster.command"}
DEV_INSTALL = "pip install -e '.[dev]' from a checkout of numalign"


def usage() -> str:
    lines = ["usage: numalign COMMAND [ARGS...]", "", "commands:"]
    width = max(len(name) for name in SUBCOMMANDS)
    lines += [f"  {name:<{width}} {text}" for name, text in SUBCOMMANDS.items()]
    lines += ["", "'numalign COMMAND --help' shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("--version", "version"):
        from numalign import __version__

        print(f"numalign {__version__}")
        return 0
    name = args[0]
    if name not in SUBCOMMANDS:
        print(f"numalign: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name = MODULES.get(name, f"numalign.commands.{name.replace('-', '_')}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if name in MODULES and e.name in (module_name, module_name.rpartition(".")[0]):
            print(f"numalign: {name!r} needs the development install (it is not in the "
                  f"runtime wheel): {DEV_INSTALL}", file=sys.stderr)
            return 2
        if e.name == module_name:
            print(f"numalign: command {name!r} is not available in this build", file=sys.stderr)
            return 2
        raise
    from numalign.topology import policies
    from numalign.topology.policies.loader import PolicyPluginError

    try:
        if name in LOADS_PLUGINS:
            policies.names()
        code: int = module.main(args[1:])
    except PolicyPluginError as e:
        print(f"numalign {name}: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
