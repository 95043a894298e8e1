"""A scheduler extender that decides nothing (bench/bench_fleet.py, mode ``noop``): on the
dev cluster's extender port, with its TLS (serving certificate, client CA), every node
passes the filter, every node scores 0, and a pod is bound where the scheduler chose.
What it costs a scheduling cycle is the extender's HTTP share.

    python bench/fleet_noop.py --port P --cert C --key K --client-ca CA --kubeconfig KC
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
from typing import Any

from aiohttp import web

from numalign.api.kube import ApiError, Kube, load_config, q


def app(kube: Kube) -> web.Application:
    async def filter_(request: web.Request) -> web.Response:
        args = json.loads(await request.read())
        names = args.get("NodeNames")
        nodes = None if names is not None else args.get("Nodes")
        return web.json_response({"Nodes": nodes, "NodeNames": names, "FailedNodes": {},
                                  "FailedAndUnresolvableNodes": {}, "Error": ""})

    async def prioritize(request: web.Request) -> web.Response:
        args = json.loads(await request.read())
        names = args.get("NodeNames") or [
            n["metadata"]["name"] for n in ((args.get("Nodes") or {}).get("items") or [])]
        return web.json_response([{"Host": n, "Score": 0} for n in names])

    async def bind(request: web.Request) -> web.Response:
        a = json.loads(await request.read())
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": a["PodName"], "namespace": a["PodNamespace"],
                         "uid": a["PodUID"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": a["Node"]}}
        try:
            await kube.create(f"/api/v1/namespaces/{q(a['PodNamespace'])}/pods/"
                              f"{q(a['PodName'])}/binding", body)
        except ApiError as e:
            return web.json_response({"Error": f"{e.status} {e.reason}"})
        return web.json_response({"Error": ""})

    application = web.Application()
    application.add_routes([web.post("/filter", filter_), web.post("/prioritize", prioritize),
                            web.post("/bind", bind)])
    return application


async def serve(args: argparse.Namespace) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.cert, args.key)
    ctx.load_verify_locations(args.client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    async with Kube(load_config(args.kubeconfig), max_connections=16,
                    user_agent="numalign-noop-extender") as kube:
        runner = web.AppRunner(app(kube), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.port, ssl_context=ctx).start()
        print("ready", flush=True)
        await asyncio.Event().wait()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fleet_noop")
    for flag in ("--cert", "--key", "--client-ca", "--kubeconfig"):
        p.add_argument(flag, required=True)
    p.add_argument("--port", type=int, required=True)
    asyncio.run(serve(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
