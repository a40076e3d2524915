"""build_service_monitor: tells a Prometheus Operator to scrape the runtime's metrics port.

Why it exists: the autoscaler reads p99 and queue depth from Prometheus; with the Prometheus
Operator installed this is how scraping is declared. Built only when its CRD exists.
"""

from kiln_operator import constants
from kiln_operator.builders.naming import Manifest, Owner, selector_labels

SERVICE_MONITOR_GROUP = "monitoring.coreos.com"
SERVICE_MONITOR_VERSION = "v1"
SERVICE_MONITOR_PLURAL = "servicemonitors"
SCRAPE_INTERVAL = "15s"
INFERENCESERVICE_POD_LABEL = "__meta_kubernetes_pod_label_serving_kiln_dev_inferenceservice"
"""Prometheus' discovery label for the pod label constants.LABEL_INFERENCESERVICE."""
TRACK_POD_LABEL = "__meta_kubernetes_pod_label_serving_kiln_dev_track"
"""Prometheus' discovery label for constants.LABEL_TRACK (a canary's pods only)."""


def build_service_monitor(owner: Owner) -> Manifest:
    """The desired ServiceMonitor."""
    return {
        "apiVersion": f"{SERVICE_MONITOR_GROUP}/{SERVICE_MONITOR_VERSION}",
        "kind": "ServiceMonitor",
        "metadata": owner.metadata(),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner.name)},
            "namespaceSelector": {"matchNames": [owner.namespace]},
            "endpoints": [
                {
                    "port": constants.PORT_NAME_METRICS,
                    "path": constants.METRICS_PATH,
                    "interval": SCRAPE_INTERVAL,
                    # The autoscaler's queries select a service's series by this label
                    # (namespace and pod the Prometheus Operator adds itself); a canary's
                    # series by kiln_track (absent on the stable version's pods).
                    "relabelings": [
                        {
                            "sourceLabels": [INFERENCESERVICE_POD_LABEL],
                            "targetLabel": "inferenceservice",
                        },
                        {"sourceLabels": [TRACK_POD_LABEL], "targetLabel": "kiln_track"},
                    ],
                }
            ],
        },
    }
