# SPDX-License-Identifier: Apache-2.0
"""Issue 12 item 3: deploy/kubernetes/ parses, its config passes the daemon's own check, and the
manifests agree with the config and with each other (ports, paths, groups)."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any, Dict, List

import yaml

import ringloader as rl

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def load(name: str) -> List[Dict[str, Any]]:
    with open(DEPLOY / name) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def by_kind(docs: List[Dict[str, Any]], kind: str) -> Dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def mounts(pod_spec: Dict[str, Any]) -> Dict[str, str]:
    """mountPath -> hostPath (or "configMap:NAME") of the pod's first container."""
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    out = {}
    for m in pod_spec["containers"][0]["volumeMounts"]:
        v = volumes[m["name"]]
        out[m["mountPath"]] = v["hostPath"]["path"] if "hostPath" in v else \
            "configMap:" + v["configMap"]["name"]
    return out


def assert_daemon_accepts(toml_text: str, tmp_path: Path) -> None:
    """`ringloaderd --check-config` passes the config."""
    path = tmp_path / "ringloaderd.toml"
    path.write_text(toml_text)
    checked = subprocess.run([rl.find_binary("ringloaderd"), "--config", str(path),
                              "--check-config"], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr


def test_manifests_agree_with_the_config_and_each_other(tmp_path: Path) -> None:
    daemon_docs = load("ringloaderd.yaml")
    config_map = by_kind(daemon_docs, "ConfigMap")
    daemon_set = by_kind(daemon_docs, "DaemonSet")
    # The image is tagged with the version (named once, in CMakeLists.txt's project()).
    image = daemon_set["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ringloader:{rl.__version__}", image
    trainer = by_kind(load("trainer-pod.yaml"), "Pod")

    toml_text = config_map["data"]["ringloaderd.toml"]
    config = tomllib.loads(toml_text)
    # The daemon itself accepts it (every key known, every rule kept).
    assert_daemon_accepts(toml_text, tmp_path)

    pod = daemon_set["spec"]["template"]["spec"]
    container = pod["containers"][0]
    daemon_mounts = mounts(pod)
    trainer_mounts = mounts(trainer["spec"])

    # --config names the ConfigMap's key where the ConfigMap is mounted.
    command = container["command"]
    config_path = Path(command[command.index("--config") + 1])
    assert daemon_mounts[str(config_path.parent)] == "configMap:" + config_map["metadata"]["name"]
    assert config_path.name in config_map["data"]

    # Probes dial health_listen's port; Prometheus scrapes metrics_listen's, as the pod's
    # annotations say; the container declares both.
    port = int(config["server"]["health_listen"].rsplit(":", 1)[1])
    metrics_port = int(config["server"]["metrics_listen"].rsplit(":", 1)[1])
    assert {p["containerPort"] for p in container["ports"]} == {port, metrics_port}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["grpc"]["port"] == port
    annotations = daemon_set["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == metrics_port
    assert annotations["prometheus.io/path"] == "/metrics"

    # The socket's directory and shm_dir are the same host directories in both pods.
    socket = config["server"]["listen"].removeprefix("unix:")
    socket_dir = str(Path(socket).parent)
    shm_dir = config["server"]["shm_dir"]
    for directory in (socket_dir, shm_dir):
        assert daemon_mounts[directory] == trainer_mounts[directory], directory
    assert config["server"]["state_dir"] in daemon_mounts
    env = {e["name"]: e["value"] for e in trainer["spec"]["containers"][0]["env"]}
    assert env["RINGLOADER_ENDPOINT"] == config["server"]["listen"]

    # Every dataset lives under a mounted directory.
    for dataset in config["datasets"]:
        assert any(dataset["path"].startswith(m + "/") for m in daemon_mounts), dataset["path"]

    # The trainer is in the daemon's group: socket 0660 and rings 0640 let it in, read-only.
    assert pod["securityContext"]["runAsGroup"] in trainer["spec"]["securityContext"][
        "supplementalGroups"]
    assert config["server"]["socket_mode"] == "0660"
    assert config["server"]["segment_mode"] == "0640"


def test_feeder_manifests_agree_with_their_config(tmp_path: Path) -> None:
    """Issue 40 item 5: the feeders' Deployment, headless Service and autoscaler agree with the
    feeders' config (ports, mounts), the config passes the daemon's own check, and the autoscaler
    scales on a series the training nodes' daemons export."""
    docs = load("feeders.yaml")
    config_map = by_kind(docs, "ConfigMap")
    deployment = by_kind(docs, "Deployment")
    service = by_kind(docs, "Service")
    hpa = by_kind(docs, "HorizontalPodAutoscaler")
    toml_text = config_map["data"]["ringloaderd.toml"]
    config = tomllib.loads(toml_text)
    assert_daemon_accepts(toml_text, tmp_path)

    feeder_port = int(config["server"]["feeder_listen"].rsplit(":", 1)[1])
    data_port = int(config["server"]["feeder_data_listen"].rsplit(":", 1)[1])
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == f"ringloader:{rl.__version__}"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["feeder"] == feeder_port
    assert ports["feeder-data"] == data_port  # hosts dial the pod's IP there
    assert ports["health"] == int(config["server"]["health_listen"].rsplit(":", 1)[1])
    assert ports["metrics"] == int(config["server"]["metrics_listen"].rsplit(":", 1)[1])
    # Headless, selecting the Deployment's pods, on the feeder port: its name is each feeder.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [feeder_port, data_port]
    # [tls]'s files are where the Secret is mounted; the config's dataset path is mounted.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    for key in ("ca", "cert", "key"):
        directory = str(Path(config["tls"][key]).parent)
        assert "secret" in mounted[directory], (key, directory)
    command = container["command"]
    config_dir = str(Path(command[command.index("--config") + 1]).parent)
    assert mounted[config_dir]["configMap"]["name"] == config_map["metadata"]["name"]
    data_path = config["datasets"][0]["path"]
    assert any(data_path.startswith(m + "/") for m in mounted), data_path
    # The autoscaler targets the Deployment, on a series the daemon's /metrics has.
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    metric = hpa["spec"]["metrics"][0]["external"]["metric"]["name"]
    assert metric == "ringloader_trainer_input_bound"
    rules = (DEPLOY.parent / "prometheus" / "ringloader-rules.yml").read_text()
    assert metric in rules  # the series the alert rules (tested with promtool) use
