"""Where the shipped deployment files bind the metrics endpoint: never on every
address. The DaemonSet binds the pod's IP and ships a NetworkPolicy that admits only
Prometheus to that port; compose binds the daemon's address on the project network and
publishes it on the host's loopback only.

Unit tests (no process): the files parsed, the policy checked against the Kubernetes schemas.
"""

from __future__ import annotations

import kubernetes_validate
import yaml

from helpers.commands import REPO, parse_pixpool
from pixpool.shared.stream.config import DaemonConfig
from pixpool.shared.stream.flags import from_args

_EVERY_ADDRESS = {"0.0.0.0", "::", ""}


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((REPO / "deploy" / name).read_text()) if d]


def test_the_daemonset_binds_the_pod_ip_and_only_prometheus_may_connect():
    (ds,) = _docs("daemonset.yaml")
    pod = ds["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    config = from_args(DaemonConfig, parse_pixpool(c["command"]))
    assert config.metrics_host == "$(POD_IP)"  # expanded by Kubernetes from the env below
    (env,) = [e for e in c["env"] if e["name"] == "POD_IP"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    (policy,) = _docs("networkpolicy.yaml")
    kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [config.metrics_port]
    assert str(config.metrics_port) == pod["metadata"]["annotations"]["prometheus.io/port"]
    assert all(peer.get("podSelector") for peer in rule["from"])  # named pods, not a whole namespace or all


def test_compose_binds_no_wildcard_and_publishes_on_loopback_only():
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    daemon = compose["services"]["daemon"]
    config = from_args(DaemonConfig, parse_pixpool(daemon["command"]))
    assert config.metrics_host not in _EVERY_ADDRESS
    assert config.metrics_host == "daemon"  # this container's own address on the project's network
    for published in daemon.get("ports", []):
        assert published.startswith("127.0.0.1:"), published
    for name, service in compose["services"].items():
        assert not service.get("ports") or name == "daemon", f"{name} publishes ports"
