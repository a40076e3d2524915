"""The Prometheus discovery configuration Kiln ships: the docs show the files as they are, the
tests' Prometheus includes the shipped scrape configuration unchanged, and its relabelling keeps
only Kiln's metrics ports and gives the autoscaler's three labels."""

import yaml

from kiln_localcluster.discovery import discovery_config
from tests.sessioncluster import REPO

MANIFESTS = REPO / "manifests" / "prometheus"
DOC = REPO / "docs" / "prometheus.md"


def test_the_docs_show_the_shipped_files_verbatim() -> None:
    doc = DOC.read_text()
    for name in ("scrape-config.yaml", "rbac.yaml"):
        assert f"```yaml\n{(MANIFESTS / name).read_text()}```" in doc, name


def test_the_tests_prometheus_includes_the_shipped_file_itself() -> None:
    shipped = MANIFESTS / "scrape-config.yaml"
    config = discovery_config(shipped, interval_seconds=1.0)
    assert config["scrape_config_files"] == [str(shipped)]
    assert config["global"]["scrape_interval"] == "1000ms"
    assert "scrape_configs" not in config


def test_the_shipped_job_discovers_pods_in_cluster_and_relabels_by_kiln_s_labels() -> None:
    (job,) = yaml.safe_load((MANIFESTS / "scrape-config.yaml").read_text())["scrape_configs"]
    (sd,) = job["kubernetes_sd_configs"]
    # in-cluster credentials: no server, token or CA named in the file
    assert set(sd) == {"role", "selectors"} and sd["role"] == "pod"
    assert "scrape_interval" not in job  # the global one (tests: 1 s; docs: 15 s or less)
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"namespace", "pod", "inferenceservice"} <= targets
    kept = {
        (r["source_labels"][0], r["regex"])
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    assert ("__meta_kubernetes_pod_container_port_name", "metrics") in kept


def test_the_shipped_rbac_binds_the_service_account_to_list_and_watch_pods_only() -> None:
    account, role, binding = yaml.safe_load_all((MANIFESTS / "rbac.yaml").read_text())
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    (subject,) = binding["subjects"]
    assert (subject["name"], subject["namespace"]) == (
        account["metadata"]["name"], account["metadata"]["namespace"],
    )  # fmt: skip
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
