"""Command line: ``serve`` a model, or write an ``example-model`` built in code.

python -m kiln_runtime serve --model-path PATH --model-name NAME [--config FILE] [--host ADDR]
                             [--http-port 8000] [--grpc-port 8001] [--metrics-port 8002]
                             [--grpc-transport kiln|grpcio [--grpc-tls-cert F --grpc-tls-key F]]
                             [--event-loop auto|uvloop|asyncio] [--termination-log FILE]
python -m kiln_runtime example-model --kind mlp|transformer --out DIR
python -m kiln_runtime fetch --uri s3://BUCKET/KEY|https://… --dest DIR [...]  (an init container)

The config is read from ``--config`` or else from the ``KILN_RUNTIME_CONFIG`` variable (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from kiln_runtime.termination import TERMINATION_LOG, write_termination_log

CONFIG_ENV = "KILN_RUNTIME_CONFIG"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kiln_runtime",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve one model over HTTP and gRPC")
    serve.add_argument(
        "--model-path",
        type=Path,
        required=True,
        help="model file, or a directory holding model.pt / model.pt2 / model.onnx",
    )
    serve.add_argument("--model-name", required=True, help="the name clients address")
    serve.add_argument("--config", type=Path, help=f"runtime config JSON (else ${CONFIG_ENV})")
    serve.add_argument("--host", default="0.0.0.0", help="bind address for all three ports")
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--grpc-port", type=int, default=8001)
    serve.add_argument("--metrics-port", type=int, default=8002)
    serve.add_argument(
        "--grpc-transport", choices=("kiln", "grpcio"), default="kiln",
        help="kiln: the runtime's own HTTP/2 (fast); grpcio: grpcio's server (TLS, streaming)",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-tls-cert", type=Path, help="PEM certificate chain: gRPC over TLS (grpcio only)"
    )
    serve.add_argument("--grpc-tls-key", type=Path, help="PEM private key of --grpc-tls-cert")
    serve.add_argument(
        "--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
        help="auto: uvloop (libuv: fewer µs per call) unless --grpc-transport grpcio, whose "
        "server runs on asyncio's own loop",
    )  # fmt: skip
    serve.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="compute threads (default: one per CPU this process may use)",
    )
    serve.add_argument(
        "--termination-log", type=Path, default=TERMINATION_LOG,
        help="where a start-up failure's cause is written for Kubernetes (the container's "
        "terminationMessagePath)",
    )  # fmt: skip
    serve.add_argument("--log-level", default="INFO")

    example = commands.add_parser("example-model", help="write a model built in code + config")
    example.add_argument("--kind", choices=("mlp", "transformer"), required=True)
    example.add_argument("--out", type=Path, required=True)
    example.add_argument("--name", default=None, help="model name in config.json (default: kind)")
    example.add_argument("--format", choices=("torchscript", "torch_export"), default="torchscript")

    from kiln_runtime.fetch.command import add_arguments as add_fetch_arguments

    add_fetch_arguments(commands.add_parser("fetch", help="download a model into DEST/model"))
    return parser  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "example-model":
        from kiln_runtime.examples import write_example

        path = write_example(args.kind, args.out, name=args.name, fmt=args.format)
        print(f"wrote {path} and {args.out / 'config.json'}")
        return 0

    if args.command == "fetch":
        from kiln_runtime.fetch.command import run as run_fetch

        return run_fetch(args)

    def refuse(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        write_termination_log(args.termination_log, message)
        return 2

    if (args.grpc_tls_cert is None) != (args.grpc_tls_key is None):
        return refuse("--grpc-tls-cert and --grpc-tls-key go together")
    if args.grpc_tls_cert is not None and args.grpc_transport != "grpcio":
        return refuse("gRPC TLS needs --grpc-transport grpcio")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Imported here: it loads numpy, which the fetch init container never needs.
    from kiln_runtime.config import ConfigError, parse_config_text

    if args.config is not None:
        try:
            text = args.config.read_text()
        except OSError as error:
            return refuse(f"cannot read --config: {error}")
    elif os.environ.get(CONFIG_ENV):
        text = os.environ[CONFIG_ENV]
    else:
        return refuse(f"a config is required (--config FILE or ${CONFIG_ENV})")
    try:
        config = parse_config_text(text, model_name=args.model_name)
    except ConfigError as error:
        return refuse(f"invalid runtime config: {error}")

    from kiln_runtime.server import ServeOptions, serve, usable_cpus

    options = ServeOptions(
        model_path=args.model_path,
        config=config,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        grpc_transport=args.grpc_transport,
        grpc_tls_cert=args.grpc_tls_cert,
        grpc_tls_key=args.grpc_tls_key,
        torch_threads=args.torch_threads or usable_cpus(),
        termination_log=args.termination_log,
    )
    loop_factory = event_loop_factory(args.event_loop, args.grpc_transport)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(serve(options))
    except Exception as error:  # e.g. a port already bound: still the operator's to read
        write_termination_log(args.termination_log, f"the runtime stopped: {error!r}")
        raise


def event_loop_factory(
    choice: str, grpc_transport: str
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop, or None for asyncio's own (``--event-loop``)."""
    if choice == "asyncio" or (choice == "auto" and grpc_transport == "grpcio"):
        return None
    import uvloop

    return uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(main())
