"""`python -m kiln_runtime.activator`: the activator process (docs/scale-to-zero.md).

Why it exists: the thin shell around ``app.Activator``: flags, logging, the event loop, and a
graceful stop on SIGTERM (GOAWAY to gRPC clients, held requests answered as waking).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence

from kiln_runtime.activator.app import Activator, Ports, Settings
from kiln_runtime.activator.hold import HoldLimits

log = logging.getLogger("kiln_runtime.activator")


def parse(argv: Sequence[str] | None) -> tuple[str, Ports, Settings]:
    parser = argparse.ArgumentParser(prog="python -m kiln_runtime.activator", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--control-port", type=int, default=9090)
    defaults = HoldLimits()
    parser.add_argument("--max-held-requests", type=int, default=defaults.max_requests,
                        help="requests held per service at once")  # fmt: skip
    parser.add_argument("--max-held-bytes", type=int, default=defaults.max_bytes,
                        help="request bytes held per service at once")  # fmt: skip
    parser.add_argument("--hold-timeout-seconds", type=float, default=defaults.timeout_seconds,
                        help="the longest a request waits for a ready pod")  # fmt: skip
    parser.add_argument("--max-services", type=int, default=defaults.max_services)
    parser.add_argument("--max-body-bytes", type=int, default=Settings().max_body_bytes)
    parser.add_argument("--max-connection-age-seconds", type=float,
                        default=Settings().max_connection_age_seconds,
                        help="gRPC connections are drained (GOAWAY) at this age")  # fmt: skip
    parser.add_argument("--max-in-flight-per-pod", type=int,
                        default=Settings().max_in_flight_per_pod,
                        help="released requests in flight to one pod at once")  # fmt: skip
    args = parser.parse_args(argv)
    for name in (
        "max_held_requests", "max_held_bytes", "max_services", "max_body_bytes",
        "max_in_flight_per_pod",
    ):  # fmt: skip
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.hold_timeout_seconds <= 0 or args.max_connection_age_seconds <= 0:
        parser.error("--hold-timeout-seconds and --max-connection-age-seconds must be above 0")
    hold = HoldLimits(
        max_requests=args.max_held_requests,
        max_bytes=args.max_held_bytes,
        timeout_seconds=args.hold_timeout_seconds,
        max_services=args.max_services,
    )
    ports = Ports(args.http_port, args.grpc_port, args.control_port)
    settings = Settings(
        hold=hold,
        max_body_bytes=args.max_body_bytes,
        max_in_flight_per_pod=args.max_in_flight_per_pod,
        max_connection_age_seconds=args.max_connection_age_seconds,
    )
    return args.host, ports, settings


async def run(host: str, ports: Ports, settings: Settings) -> None:
    activator = Activator(settings)
    bound = await activator.start(host, ports)
    log.info("activator listening: http %d, grpc %d, control %d", *vars(bound).values())
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    log.info("stopping: GOAWAY to gRPC clients, closing the ports")
    await activator.stop()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(run(*parse(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
