"""`python -m kiln_operator run` (or `kiln run`): start the operator in the foreground.

Why it exists: one entry point with the right kopf settings for every way Kiln runs — the
operator Deployment, `make run-operator` against a local cluster, and the tests.
"""

import argparse
import logging
import os
import secrets
import sys

import kopf

from kiln_operator import constants

PEERING_NAME = "kiln-operator"
"""The ClusterKopfPeering object (manifests/base) through which replicas elect one active."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description="Kiln's Kubernetes operator.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the operator in the foreground")
    run.add_argument(
        "--standalone",
        action="store_true",
        help="skip peering (only for a single operator process, e.g. development)",
    )
    run.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority; the highest live peer acts, the others wait (default: random)",
    )
    run.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="serve only this namespace (repeatable); default: every namespace",
    )
    run.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    run.add_argument("--verbose", action="store_true", help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the operator until it is stopped."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not args.verbose:
        # kopf logs "Handler ... succeeded" for every watch event it hands a handler: tens of
        # thousands of lines while 1,000 services are created, a few percent of the operator's
        # CPU, and nothing a reader acts on. Its warnings and errors still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    from kiln_operator.handlers import (  # noqa: F401  (importing registers the handlers)
        autoscaler,
        inferenceservice,
        platform,
        warmup_gate,
    )

    # kopf refuses to start with an admission handler and no webhook server: register it only
    # when the webhook is configured.
    if os.environ.get(constants.ENV_WEBHOOK_PORT):
        from kiln_operator.handlers import admission  # noqa: F401

    priority = args.priority if args.priority is not None else 1 + secrets.randbelow(2**30)
    kopf.run(
        standalone=args.standalone,
        priority=priority,
        peering_name=None if args.standalone else PEERING_NAME,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(namespaces=list(args.namespace)),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
