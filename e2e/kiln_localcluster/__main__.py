"""Command line: ``python -m kiln_localcluster up|down|status|… [--state-dir DIR]``."""

import argparse
import sys
from pathlib import Path

from kiln_localcluster.cluster import ClusterOptions, LocalCluster, relayed_ports
from kiln_localcluster.node import NODE_IP, NODE_NAME
from kiln_localcluster.relay import relay_forever
from kiln_localcluster.targets import publish_forever, targets_file
from kiln_localcluster.volumes import provision_claim


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kiln-localcluster", description=__doc__)
    parser.add_argument(
        "command",
        choices=[
            "up",
            "down",
            "status",
            "provide-claim",
            "import-image",
            "publish-targets",
            "serve-bucket",
            "relay",
        ],
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".kiln"),
        help="where the cluster keeps its state and kubeconfig (default: ./.kiln)",
    )
    parser.add_argument("--namespace", help="provide-claim: the claim's namespace")
    parser.add_argument("--claim", help="provide-claim: the claim's name")
    parser.add_argument(
        "--dir", type=Path, help="provide-claim: the directory it offers; serve-bucket: its data"
    )
    parser.add_argument("--upload", type=Path, help="serve-bucket: the files to put in the bucket")
    parser.add_argument("--bucket", default="models", help="serve-bucket: the bucket's name")
    parser.add_argument(
        "--info", type=Path, help="serve-bucket: where to write its endpoint and keys (JSON)"
    )
    parser.add_argument("--nodes", type=int, default=ClusterOptions.nodes)
    parser.add_argument("--gpus-per-node", type=int, default=ClusterOptions.gpus_per_node)
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="up: also run a real node (containerd, kubelet, kube-proxy); needs root",
    )
    parser.add_argument("--image", help="import-image: a Docker image to give the real node")
    args = parser.parse_args(argv)
    state_dir = args.state_dir.resolve()
    cluster = LocalCluster(
        state_dir,
        ClusterOptions(
            nodes=args.nodes, gpus_per_node=args.gpus_per_node, real_node=args.real_node
        ),
    )
    if args.command == "up":
        print(f"export KUBECONFIG={cluster.up().kubeconfig}")
    elif args.command == "down":
        cluster.down()
        print("local cluster stopped", file=sys.stderr)
    elif args.command == "publish-targets":
        info = cluster.recorded_info()
        if info is None:
            print("local cluster is not running", file=sys.stderr)
            return 1
        publish_forever(cluster.api_reader(info.server), NODE_NAME, targets_file(cluster.dir))
    elif args.command == "relay":
        info = cluster.recorded_info()
        if info is None:
            print("local cluster is not running", file=sys.stderr)
            return 1
        relay_forever(NODE_IP, relayed_ports(info))
    elif args.command == "import-image":
        if not args.image:
            print("import-image needs --image", file=sys.stderr)
            return 1
        cluster.import_image(args.image)
    elif args.command == "provide-claim":
        if (info := cluster.info()) is None or not (args.namespace and args.claim and args.dir):
            print("needs a running cluster and --namespace, --claim, --dir", file=sys.stderr)
            return 1
        provision_claim(info, args.namespace, args.claim, args.dir)
    elif args.command == "serve-bucket":
        # On the real node's bridge address: pods reach it, nothing outside this machine does.
        if not (args.dir and args.upload and args.info):
            print("serve-bucket needs --dir, --upload and --info", file=sys.stderr)
            return 1
        from kiln_localcluster.objectstore import serve_bucket  # boto3: only for this command

        return serve_bucket(args.dir, args.upload, args.bucket, NODE_IP, args.info)
    else:
        if (info := cluster.info()) is None:
            print("local cluster is not running", file=sys.stderr)
            return 1
        print(f"local cluster up at {info.server}\nexport KUBECONFIG={info.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
