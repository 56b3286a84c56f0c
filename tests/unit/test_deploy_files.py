"""The container and Kubernetes files: parsed and checked, since no container engine or
cluster runs here.

Unit tests (no process): the Dockerfile's stages and what each installs, compose.yaml's
sharing between daemon and trainers, the manifests against the Kubernetes OpenAPI schemas
(``kubernetes-validate``, schemas bundled, offline), and every command line in them parsed
by the real parsers: pixpool's own, torchrun's, the example script's.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib

import kubernetes_validate
import pytest
import yaml

from helpers.commands import REPO, BadCommand, parse_command, parse_pixpool, parse_torchrun
from pixpool.shared.stream.config import DaemonConfig
from pixpool.shared.stream.flags import from_args

# The newest Kubernetes version whose schemas the installed kubernetes-validate bundles.
K8S_VERSION = kubernetes_validate.latest_version()


# -- Dockerfile ----------------------------------------------------------------------------
def dockerfile_stages(text: str) -> dict[str, dict]:
    """stage name -> {"from": parent, "lines": [(instruction, arguments), ...]}; continuations joined."""
    joined = re.sub(r"\\\n", " ", text)
    stages: dict[str, dict] = {}
    current = None
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest.strip(), re.IGNORECASE)
            if not m:
                raise ValueError(f"Dockerfile: FROM {rest!r} names no stage (FROM IMAGE AS NAME)")
            current = stages[m.group(2)] = {"from": m.group(1), "lines": []}
        elif current is not None:
            current["lines"].append((instruction, rest.strip()))
    return stages


def stage_chain(stages: dict, name: str) -> list[tuple[str, str]]:
    """Every instruction that builds ``name``, its parent stages first."""
    lines = []
    while name in stages:
        lines = stages[name]["lines"] + lines
        name = stages[name]["from"]
    return lines


def _exec_form(arguments: str) -> list[str]:
    return json.loads(arguments.removeprefix("CMD "))  # HEALTHCHECK [options] CMD [...]


@pytest.fixture(scope="module")
def stages() -> dict:
    return dockerfile_stages((REPO / "Dockerfile").read_text())


def test_dockerfile_has_a_serving_and_a_trainer_target(stages):
    assert {"serve", "train"} <= set(stages)
    serve_runs = " ".join(a for i, a in stage_chain(stages, "serve") if i == "RUN")
    train_runs = " ".join(a for i, a in stage_chain(stages, "train") if i == "RUN")
    # The serving image: `pip install .` of the core package, torch nowhere.
    assert (
        re.search(r"pip install \.(\s|$)", serve_runs)
        and "torch" not in serve_runs.lower()
        and "[train]" not in serve_runs
    )
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(d.lower().startswith("torch") for d in core), core  # so `pip install .` pulls no torch
    # The trainer image: torch from a build-arg index (CPU by default), then the train extra.
    assert (
        "torch==${TORCH_VERSION}" in train_runs
        and "--index-url ${TORCH_INDEX_URL}" in train_runs
        and '".[train]"' in train_runs
    )
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for i, a in stage_chain(stages, "train") if i == "ARG" and "=" in a}
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")


def test_dockerfile_copies_what_exists_and_runs_real_commands(stages):
    for name in stages:
        for instruction, arguments in stages[name]["lines"]:
            if instruction == "COPY":
                *sources, _ = shlex.split(arguments)
                assert all((REPO / s).exists() for s in sources), (name, sources)
            if instruction in ("CMD", "HEALTHCHECK"):
                parse_command(
                    _exec_form(arguments[arguments.index("CMD ") :] if instruction == "HEALTHCHECK" else arguments)
                )
    # What the build context leaves out must not be what a stage copies.
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = [s for name in stages for i, a in stages[name]["lines"] if i == "COPY" for s in shlex.split(a)[:-1]]
    assert not [(s, pat) for s in copied for pat in ignored if fnmatch.fnmatch(s, pat)], ignored
    health = [a for i, a in stage_chain(stages, "serve") if i == "HEALTHCHECK"]
    probe = parse_pixpool(_exec_form(health[0][health[0].index("CMD ") :])) if len(health) == 1 else None
    assert probe is not None and probe.command == "status" and probe.probe, (
        "the healthcheck asks for health, not the full status"
    )


def test_dockerfile_copies_everything_pip_install_builds_from(stages):
    """`pip install .` in the image needs every folder pyproject maps a package to and the
    build script of the render kernel; a missing one fails the build (or drops the kernel)."""
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    needed = {"pyproject.toml", "setup.py"} | {folder.split("/")[0] for folder in setup["package-dir"].values()}
    copied = {s.rstrip("/") for i, a in stage_chain(stages, "serve") if i == "COPY" for s in shlex.split(a)[:-1]}
    assert needed <= copied, f"the serve stage does not copy {sorted(needed - copied)}"


# -- compose.yaml --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "compose.yaml").read_text())


def _mounts(service: dict) -> dict[str, str]:
    """container path -> source of a service's short-syntax volumes."""
    out = {}
    for v in service.get("volumes", []):
        source, target, *_ = v.split(":")
        out[target] = source
    return out


def test_compose_runs_a_daemon_and_two_trainers_that_share_its_store_and_sockets(compose, stages):
    services = compose["services"]
    daemon = services["daemon"]
    trainers = {k: v for k, v in services.items() if k != "daemon"}
    assert len(trainers) == 2
    assert daemon["build"]["target"] == "serve" and daemon["build"]["target"] in stages
    assert daemon["ipc"] == "shareable" and re.fullmatch(r"\d+[kmg]b?", str(daemon["shm_size"]).lower())
    serve = parse_pixpool(daemon["command"])
    assert serve.command == "serve"
    config = from_args(DaemonConfig, serve)  # values valid, not only flag names
    socket_dir = config.socket_dir
    assert socket_dir and _mounts(daemon)[socket_dir] in compose["volumes"]  # a named volume
    health = daemon["healthcheck"]["test"]
    assert health[0] == "CMD" and parse_pixpool(health[1:]).command == "status" and parse_pixpool(health[1:]).probe
    assert parse_pixpool(health[1:]).socket_dir == socket_dir
    for name, t in trainers.items():
        assert t["build"]["target"] == "train" and t["ipc"] == "service:daemon", name  # the daemon's /dev/shm
        assert _mounts(t)[socket_dir] == _mounts(daemon)[socket_dir], name
        assert t["depends_on"]["daemon"]["condition"] == "service_healthy"
        parsed = parse_command(t["command"])
        trainer_socket_dir = parsed[1].socket_dir if isinstance(parsed, tuple) else parsed.socket_dir
        assert trainer_socket_dir == socket_dir, name


# -- Kubernetes ----------------------------------------------------------------------------
def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((REPO / "deploy" / name).read_text()) if d]


@pytest.mark.parametrize("name", ["daemonset.yaml", "trainer-job.yaml"])
def test_manifests_validate_against_the_kubernetes_schemas(name):
    for doc in _docs(name):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError


def test_the_schema_check_catches_a_misspelled_field():
    ds = _docs("daemonset.yaml")[0]
    ds["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["comand"] = ["pixpool", "status"]
    with pytest.raises(kubernetes_validate.ValidationError, match="comand"):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


def _volumes(pod: dict) -> dict[str, dict]:
    return {v["name"]: v for v in pod["volumes"]}


def _host_path_of(pod: dict, container: dict, mount_path: str) -> str:
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == mount_path]
    return _volumes(pod)[mount["name"]]["hostPath"]["path"]


def test_daemonset_probes_limits_socket_dir_and_store():
    (ds,) = _docs("daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    config = from_args(DaemonConfig, parse_pixpool(c["command"]))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        status = parse_pixpool(c[probe]["exec"]["command"])
        assert status.command == "status" and status.socket_dir == config.socket_dir, probe
        assert status.probe, (
            f"{probe} asks for the full status, whose cost grows with the trainers; use `pixpool status --probe`"
        )
        assert c[probe]["timeoutSeconds"] > status.timeout_s, probe  # the probe outlives the command's own wait
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    assert pod["terminationGracePeriodSeconds"] >= 10
    assert _host_path_of(pod, c, config.socket_dir) == "/run/pixpool"
    assert _host_path_of(pod, c, "/dev/shm") == "/dev/shm"  # the store, shared with the trainer pods
    (init,) = pod["initContainers"]
    assert (
        "chmod 0700 /run/pixpool" in " ".join(init["command"])
        and _volumes(pod)["sockets"]["hostPath"]["type"] == "DirectoryOrCreate"
    )
    assert pod["securityContext"]["runAsUser"] == 1000


def test_trainer_job_runs_torchrun_against_its_nodes_daemon():
    (ds,) = _docs("daemonset.yaml")
    ds_pod = ds["spec"]["template"]["spec"]
    ds_c = ds_pod["containers"][0]
    socket_dir = from_args(DaemonConfig, parse_pixpool(ds_c["command"])).socket_dir
    service, job = _docs("trainer-job.yaml")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    argv = [a.replace("$(JOB_COMPLETION_INDEX)", "0") for a in c["command"]]
    assert any(e["name"] == "JOB_COMPLETION_INDEX" for e in c["env"])  # what Kubernetes expands in the command
    outer, inner = parse_torchrun(argv)
    assert int(outer.nnodes) == job["spec"]["parallelism"] == job["spec"]["completions"]
    assert int(outer.nproc_per_node) == int(c["resources"]["limits"]["nvidia.com/gpu"])
    assert (
        outer.master_addr == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
        and pod["subdomain"] == service["metadata"]["name"]
    )
    assert inner.socket_dir == socket_dir
    # The same host paths as the node's daemon: its socket directory and its store.
    assert _host_path_of(pod, c, socket_dir) == _host_path_of(ds_pod, ds_c, socket_dir)
    assert _host_path_of(pod, c, "/dev/shm") == _host_path_of(ds_pod, ds_c, "/dev/shm")
    assert pod["securityContext"]["runAsUser"] == ds_pod["securityContext"]["runAsUser"]
    assert pod["nodeSelector"] == ds_pod["nodeSelector"]


# -- systemd --------------------------------------------------------------------------------
def test_systemd_unit_runs_real_commands():
    unit = (REPO / "deploy" / "pixpool.service").read_text()
    env = dict(re.findall(r"^Environment=(\w+)=(.*)$", unit, re.MULTILINE))
    lines = re.findall(r"^Exec\w+=(.*)$", unit, re.MULTILINE)
    assert len(lines) >= 2
    for line in lines:
        argv = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a) for a in shlex.split(line)]
        assert argv[0] == "/usr/local/bin/pixpool"
        parse_pixpool(["pixpool", *argv[1:]])


# -- the checker itself --------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["pixpool", "serve", "data.yaml", "--sockets-dir", "/run/pixpool"],
        ["pixpool", "stat", "--socket-dir", "/run/pixpool"],
        ["pixpool", "status", "--timeout-s", "soon"],
        ["torchrun", "--nproc-per-nod", "2", "/opt/pixpool/examples/torchrun_ddp.py"],
        ["torchrun", "--nproc-per-node", "2", "/opt/pixpool/examples/torchrun_ddp.py", "--sockets", "/run/pixpool"],
        ["torchrun", "--nproc-per-node", "2", "/opt/pixpool/examples/missing.py"],
        ["python", "-m", "pixpool"],
    ],
)
def test_the_command_checker_refuses_what_would_fail(argv, capsys):
    with pytest.raises(BadCommand):
        parse_command(argv)
