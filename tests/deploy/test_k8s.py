"""The Kubernetes manifests (docker/k8s), checked without a cluster.

`kubectl kustomize` renders the default kustomization and the KEDA overlay offline; every rendered
object is validated against the Kubernetes OpenAPI schema that the `kubernetes-validate` package
ships. Then the pieces must agree with each other and with the code: every command line parses with
the project's CLI parser, the gateway and the workers connect to the server's Service on the
server's ports, the key files lie in the mounted Secret, probes ask ports that are served, the
autoscalers scale the workers, and every Secret the pods need is documented in docker/README.md.

Limits: KEDA's ScaledObject is a custom resource, whose schema kubernetes-validate does not ship;
its fields are checked one by one below instead. Nothing here shows that the pods start: the
manifests have never been applied to a cluster.
"""
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import get_type_hints

import jsonschema
import kubernetes_validate
import pytest
import yaml

from encoder_client.status import ServerStatus, check_status
from encoder_server import cli as encoder_cli
from encoder_server.options import env_name
from encoder_server.gateway.metrics import ServerStatusCollector
from encoder_server.gateway.ops_routes import ops_router
from encoder_server.server.metrics import Metrics
from encoder_server.settings import CHOICES
from test_docker import cli, compose_default, instructions

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "docker" / "k8s"
RENDERS = {"default": K8S, "keda": K8S / "overlays" / "keda"}
README = ROOT / "docker" / "README.md"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
# the oldest Kubernetes these manifests claim (autoscaling/v2 and the rest are GA there) and the newest
# schema the installed kubernetes-validate knows
KUBERNETES_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
# custom resources: no schema ships for them, test_scaled_object checks this one field by field
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}
IMAGE = "encoder-server"


# ---- rendering --------------------------------------------------------------------------------

def kubectl():
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is missing: run tests/system-packages.sh (it installs Debian's `kubectl`, whose "
                    "`kubectl kustomize` renders docker/k8s)")
    return found


def render(folder):
    result = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"`kubectl kustomize {folder.relative_to(ROOT)}` failed:\n{result.stderr}"
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


@pytest.fixture(scope="module")
def rendered():
    return {name: render(folder) for name, folder in RENDERS.items()}


@pytest.fixture(scope="module")
def objects(rendered):
    return rendered["default"]


def of_kind(objects, kind):
    return [obj for obj in objects if obj["kind"] == kind]


# ---- the commands in the manifests ------------------------------------------------------------

def encoder_argv(container):
    """The encoder-server arguments a container runs (the image's ENTRYPOINT is encoder-server)."""
    command, args = container.get("command"), container.get("args", [])
    if command is None:
        return args
    assert command[0] == "encoder-server", f"{container['name']}: runs {command[0]!r}, not encoder-server"
    return command[1:] + args


def pod_spec(deployment):
    return deployment["spec"]["template"]["spec"]


def containers(deployment, init=True):
    spec = pod_spec(deployment)
    return spec["containers"] + (spec.get("initContainers", []) if init else [])


def all_containers(objects):
    return [(deployment, container) for deployment in of_kind(objects, "Deployment")
            for container in containers(deployment)]


def runs(objects, command):
    """(Deployment, its main container, the parsed arguments) of the one Deployment that runs `command`."""
    found = [(deployment, container, cli(encoder_argv(container)))
             for deployment in of_kind(objects, "Deployment") for container in containers(deployment, init=False)
             if encoder_argv(container)[:1] == [command]]
    assert len(found) == 1, f"expected one Deployment running `encoder-server {command}`, found {len(found)}"
    return found[0]


def probes(container):
    return {kind: container[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe") if kind in container}


def container_port(container, port):
    """The number of `port` (a number or a port name) on `container`; fails when it declares no such port."""
    declared = {entry["name"]: entry["containerPort"] for entry in container.get("ports", []) if "name" in entry}
    numbers = {entry["containerPort"] for entry in container.get("ports", [])}
    number = declared.get(port, port)
    assert number in numbers, f"{container['name']}: port {port!r} is not one of its containerPorts"
    return number


def mount_of(container, path):
    """(volume name, mount) of the mount that holds `path` in `container`, the longest mount path first."""
    path = PurePosixPath(path)
    holding = [mount for mount in container.get("volumeMounts", [])
               if path == PurePosixPath(mount["mountPath"]) or PurePosixPath(mount["mountPath"]) in path.parents]
    assert holding, f"{container['name']}: nothing is mounted at {path}"
    mount = max(holding, key=lambda mount: len(mount["mountPath"]))
    return mount["name"], mount


def volume(deployment, name):
    found = [volume for volume in pod_spec(deployment).get("volumes", []) if volume["name"] == name]
    assert len(found) == 1, f"{deployment['metadata']['name']}: no volume {name!r}"
    return found[0]


def keygen_names():
    """The two files `encoder-server keygen` writes by default (NAME.key and NAME.key_secret)."""
    name = cli(["keygen", "keys"]).name
    return f"{name}.key", f"{name}.key_secret"


def dockerfile_env():
    _, final = instructions(DOCKERFILE)
    pairs = [item.split("=", 1) for name, arguments in final if name == "ENV" for item in shlex.split(arguments)]
    return dict(pairs)


def selects(selector, labels):
    return all(labels.get(key) == value for key, value in selector.items())


def server_service(objects):
    """The Service whose selector picks the server's pods."""
    server, _, _ = runs(objects, "start")
    found = [service for service in of_kind(objects, "Service")
             if selects(service["spec"]["selector"], server["spec"]["template"]["metadata"]["labels"])]
    assert len(found) == 1, f"expected one Service for the server's pods, found {len(found)}"
    return found[0]


# ---- rendering and schemas --------------------------------------------------------------------

@pytest.mark.parametrize("name", RENDERS)
def test_kustomize_renders(rendered, name):
    kinds = sorted(obj["kind"] for obj in rendered[name])
    assert kinds.count("Deployment") == 3 and kinds.count("Service") == 2, kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", RENDERS)
def test_every_object_follows_the_kubernetes_schema(rendered, name, version):
    problems = []
    for obj in rendered[name]:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except jsonschema.ValidationError as error:  # kubernetes_validate raises it, or its own subclass
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {'.'.join(map(str, error.absolute_path))}: "
                            f"{error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            problems.append(f"{error.message}: add it to CUSTOM_KINDS only with a test of its fields")
    assert not problems, f"against the schema of Kubernetes {version}:\n" + "\n".join(problems)


def test_keda_overlay_swaps_the_hpa_for_a_scaled_object_and_changes_nothing_else(rendered):
    def key(obj):
        return obj["kind"], obj["metadata"]["name"]

    default = {key(obj): obj for obj in rendered["default"]}
    keda = {key(obj): obj for obj in rendered["keda"]}
    assert [k for k in default if k[0] == "ScaledObject"] == []
    assert [k for k in keda if k[0] == "HorizontalPodAutoscaler"] == [], \
        "KEDA makes an HPA of its own for a ScaledObject: the overlay must drop the CPU one"
    assert {k: obj for k, obj in default.items() if k[0] != "HorizontalPodAutoscaler"} == \
        {k: obj for k, obj in keda.items() if k[0] != "ScaledObject"}


# ---- the command lines and how they meet -------------------------------------------------------

def test_every_container_runs_a_command_that_parses(objects):
    for deployment, container in all_containers(objects):
        if container["name"] == "seed-cache":
            continue  # `cp`, see test_read_only_root_keeps_writable_cache_and_tmp
        cli(encoder_argv(container))
        for probe in probes(container).values():
            if "exec" in probe:
                cli(encoder_argv({"name": container["name"], "command": probe["exec"]["command"]}))


def test_one_server_replica_listening_for_remote_workers(objects):
    server, _, args = runs(objects, "start")
    assert server["spec"]["replicas"] == 1, "clients open two connections; two servers behind one Service split them"
    assert server["spec"]["strategy"]["type"] == "Recreate", "a rolling update runs two servers at once"
    assert args.host == "0.0.0.0"
    assert args.worker_port, "remote workers need --worker-port"


@pytest.mark.parametrize("command", ["http", "worker"])
def test_clients_connect_to_the_server_service_on_its_ports(objects, command):
    _, _, server = runs(objects, "start")
    _, _, client = runs(objects, command)
    assert client.connect == server_service(objects)["metadata"]["name"]
    assert (client.port, client.port_out) == (server.port, server.port_out)


def test_server_service_exposes_the_client_and_worker_ports(objects):
    _, container, args = runs(objects, "start")
    service = server_service(objects)
    ports = {entry["port"]: entry for entry in service["spec"]["ports"]}
    # clients dial --port/--port-out on the Service; a remote worker dials the --worker-port number the
    # server's configuration names (and the one after it), so the Service must use those very numbers
    for number in (args.port, args.port_out, args.worker_port, args.worker_port + 1):
        assert number in ports, f"Service {service['metadata']['name']} does not expose {number}"
        assert container_port(container, ports[number].get("targetPort", number)) == number


def test_each_service_selects_only_its_deployment(objects):
    for service in of_kind(objects, "Service"):
        chosen = [deployment["metadata"]["name"] for deployment in of_kind(objects, "Deployment")
                  if selects(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])]
        assert len(chosen) == 1, f"Service {service['metadata']['name']} selects {chosen}"
    for deployment in of_kind(objects, "Deployment"):
        assert selects(deployment["spec"]["selector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"])


def test_gateway_service_and_probes_use_the_http_port(objects):
    gateway, container, args = runs(objects, "http")
    assert args.http_host == "0.0.0.0", "probes and the Service reach the pod's address, not its loopback"
    service = [service for service in of_kind(objects, "Service")
               if selects(service["spec"]["selector"], gateway["spec"]["template"]["metadata"]["labels"])]
    assert len(service) == 1
    assert [container_port(container, entry.get("targetPort", entry["port"])) for entry in service[0]["spec"]["ports"]] \
        == [args.http_port]
    served = {route.path for route in ops_router(link=None, metrics=None).routes}
    expected = {"livenessProbe": "/health", "readinessProbe": "/ready"}
    for kind, path in expected.items():
        probe = container[kind]["httpGet"]
        assert probe["path"] == path and path in served, f"{kind}: {probe['path']} (the gateway serves {served})"
        assert container_port(container, probe["port"]) == args.http_port


def test_server_probes_ask_this_server(objects):
    _, container, server = runs(objects, "start")
    assert {"readinessProbe", "livenessProbe"} <= set(probes(container))
    for kind, probe in probes(container).items():
        status = cli(encoder_argv({"name": kind, "command": probe["exec"]["command"]}))
        assert status.run is encoder_cli.status, f"{kind} should run `encoder-server status`"
        assert status.host == "127.0.0.1" and (status.port, status.port_out) == (server.port, server.port_out)
        assert probe["timeoutSeconds"] > status.timeout, f"{kind}: the probe gives up before `status` does"


def test_only_served_ports_are_probed(objects):
    for _, container in all_containers(objects):
        for kind, probe in probes(container).items():
            for action in ("httpGet", "tcpSocket", "grpc"):
                if action in probe:
                    container_port(container, probe[action]["port"])


def test_keys_come_from_the_mounted_secret(objects):
    public, secret = keygen_names()
    paths = []  # (Deployment, container, flag, path, expected file name)
    for command in ("start", "http", "worker"):
        deployment, container, args = runs(objects, command)
        if command == "start":
            paths.append((deployment, container, "--server-key", args.server_key, secret))
            for probe in probes(container).values():
                status = cli(encoder_argv({"name": "probe", "command": probe["exec"]["command"]}))
                paths += [(deployment, container, "status --server-key", status.server_key, public),
                          (deployment, container, "status --client-key", status.client_key, secret)]
        else:
            paths += [(deployment, container, "--server-key", args.server_key, public),
                      (deployment, container, "--client-key", args.client_key, secret)]
    for deployment, container, flag, path, expected in paths:
        assert path is not None and PurePosixPath(path).name == expected, f"{container['name']} {flag}: {path}"
        name, mount = mount_of(container, path)
        assert str(PurePosixPath(path).parent) == mount["mountPath"], f"{flag} {path}: not at the Secret's top"
        assert mount.get("readOnly") is True, f"{container['name']}: mount {name} should be readOnly"
        source = volume(deployment, name)
        assert "secret" in source, f"{container['name']} {flag}: {path} is not in a Secret volume"
        assert "items" not in source["secret"], "items would rename or leave out key files"
    _, container, server = runs(objects, "start")
    assert server.authorized_clients == mount_of(container, server.server_key)[1]["mountPath"], \
        "--authorized-clients should be the Secret folder, whose server.key admits the gateway and the workers"


def test_the_gateway_reads_its_api_key_from_a_secret(objects):
    _, container, args = runs(objects, "http")
    assert args.api_key is None, "a key on the command line shows in `ps`"
    env = {entry["name"]: entry for entry in container.get("env", [])}
    variable = env_name("api_key")
    assert "secretKeyRef" in env[variable]["valueFrom"]


def test_commands_parse_alike_in_the_pod_environment(objects, monkeypatch):
    """Kubernetes puts variables into a container's environment, and the CLI reads ENCODER_SERVER_<NAME>:
    with service links on, Service `encoder-server` would bring ENCODER_SERVER_PORT=tcp://...:5555."""
    image_env = dockerfile_env()
    links = {}
    for service in of_kind(objects, "Service"):
        prefix = service["metadata"]["name"].upper().replace("-", "_")
        links[f"{prefix}_SERVICE_HOST"] = "10.96.0.10"
        ports = service["spec"]["ports"]
        links[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        links[f"{prefix}_PORT"] = f"tcp://10.96.0.10:{ports[0]['port']}"
        for entry in ports:
            links[f"{prefix}_SERVICE_PORT_{entry['name'].upper().replace('-', '_')}"] = str(entry["port"])
            base = f"{prefix}_PORT_{entry['port']}_TCP"
            links.update({base: f"tcp://10.96.0.10:{entry['port']}", f"{base}_PROTO": "tcp",
                          f"{base}_PORT": str(entry["port"]), f"{base}_ADDR": "10.96.0.10"})
    for deployment, container in all_containers(objects):
        if container["name"] == "seed-cache":
            continue
        spec = pod_spec(deployment)
        env = {**image_env, **(links if spec.get("enableServiceLinks", True) else {})}
        env.update({entry["name"]: entry.get("value", "from-a-secret") for entry in container.get("env", [])})
        argv = encoder_argv(container)
        with monkeypatch.context() as patched:
            for name in [name for name in os.environ if name.startswith("ENCODER_SERVER_")]:
                patched.delenv(name)
            plain = vars(cli(argv))
            for name, value in env.items():
                patched.setenv(name, value)
            in_pod = vars(cli(argv))
        differs = {key: in_pod[key] for key in plain if in_pod[key] != plain[key] and key != "api_key"}
        assert not differs, f"{container['name']}: the pod's environment changes {differs}"


def test_pods_have_no_service_links_nor_api_token(objects):
    for deployment in of_kind(objects, "Deployment"):
        spec = pod_spec(deployment)
        assert spec.get("enableServiceLinks") is False, f"{deployment['metadata']['name']}: see the environment test"
        assert spec.get("automountServiceAccountToken") is False


# ---- autoscaling ------------------------------------------------------------------------------

def test_hpa_scales_the_workers_on_cpu(objects):
    workers, container, _ = runs(objects, "worker")
    (hpa,) = of_kind(objects, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment",
                                                                      workers["metadata"]["name"])
    assert [metric["resource"]["name"] for metric in hpa["spec"]["metrics"]] == ["cpu"]
    assert container["resources"]["requests"]["cpu"], "CPU utilization is measured against the request"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def gateway_metrics():
    """{name: type} of the metric families the gateway's /metrics exports, from its own collector fed
    a status of the shape the server sends (every number 0)."""
    def blank(schema):
        values = {}
        for name, kind in get_type_hints(schema).items():
            if hasattr(kind, "__required_keys__"):  # a nested TypedDict
                values[name] = blank(kind)
            else:
                values[name] = {bool: False, int: 0, float: 0.0, str: ""}.get(kind, {})
        return values

    status = blank(ServerStatus)
    status["metrics"] = Metrics().snapshot()
    check_status(status)

    class Link:
        pass

    link = Link()
    link.status = status
    return {family.name: family.type for family in ServerStatusCollector(link).collect()}


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
                "unless", "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk",
                "quantile", "count_values"}


def query_metrics(query):
    """The metric names in a PromQL query: its words that are no keyword and call nothing, outside label
    matchers, grouping clauses, ranges and strings."""
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", query)
    bare = re.sub(r"\{[^}]*\}|\"[^\"]*\"|'[^']*'|\[[^\]]*\]", " ", bare)
    words = re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)
    return [word[0] for word in words
            if word[0] not in PROMQL_WORDS and not bare[word.end():].lstrip().startswith("(")]


def test_query_metrics_finds_the_metric_names():
    assert query_metrics("max(encoder_pending_texts)") == ["encoder_pending_texts"]
    assert query_metrics('sum by (queue) (rate(encoder_texts_total{outcome="ok"}[1m]))') == ["encoder_texts_total"]


def test_scaled_object(rendered):
    """KEDA's ScaledObject has no schema in kubernetes-validate: its fields are checked here."""
    objects = rendered["keda"]
    workers, _, _ = runs(objects, "worker")
    (scaled,) = of_kind(objects, "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert set(scaled["spec"]) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval",
                                   "cooldownPeriod", "triggers", "advanced", "fallback", "idleReplicaCount"}
    target = scaled["spec"]["scaleTargetRef"]
    assert target["name"] == workers["metadata"]["name"]
    assert (target.get("apiVersion", "apps/v1"), target.get("kind", "Deployment")) == ("apps/v1", "Deployment")
    assert 0 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    assert all(isinstance(value, str) for value in meta.values()), "KEDA trigger metadata values are strings"
    assert re.fullmatch(r"https?://[^/\s]+(/\S*)?", meta["serverAddress"])
    assert float(meta["threshold"]) > 0
    exported = gateway_metrics()
    names = query_metrics(meta["query"])
    assert names, f"no metric in {meta['query']!r}"
    for name in names:
        assert exported.get(name) == "gauge", f"{name} is not a gauge the gateway exports: {sorted(exported)}"
    assert "encoder_pending_texts" in names, "scale on the texts waiting in the server"


# ---- resources, security, volumes --------------------------------------------------------------

QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
FACTORS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40}


def quantity(text):
    match = QUANTITY.match(str(text))
    assert match, f"not a quantity: {text!r}"
    return float(match[1]) * FACTORS[match[2]]


def test_every_container_has_requests_and_limits(objects):
    for _, container in all_containers(objects):
        resources = container.get("resources") or {}
        for resource in ("cpu", "memory"):
            request = (resources.get("requests") or {}).get(resource)
            limit = (resources.get("limits") or {}).get(resource)
            assert request and limit, f"{container['name']}: {resource} needs a request and a limit"
            assert quantity(request) <= quantity(limit), f"{container['name']}: {resource} request above its limit"


def test_everything_runs_as_the_images_unprivileged_user(objects):
    _, final = instructions(DOCKERFILE)
    uid = int([arguments for name, arguments in final if name == "USER"][-1].split(":")[0])
    for deployment in of_kind(objects, "Deployment"):
        pod = pod_spec(deployment)["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == uid
        assert pod["seccompProfile"]["type"] == "RuntimeDefault"
        for container in containers(deployment):
            context = container.get("securityContext", {})
            where = f"{deployment['metadata']['name']}/{container['name']}"
            assert context.get("runAsNonRoot") is True and context.get("runAsUser", uid) == uid, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert context.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not context.get("capabilities", {}).get("add"), where
            assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", where


def test_volume_mounts_name_volumes_that_exist(objects):
    for deployment in of_kind(objects, "Deployment"):
        volumes = {volume["name"] for volume in pod_spec(deployment).get("volumes", [])}
        mounted = set()
        for container in containers(deployment):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{container['name']} mounts {mount['name']!r}, which is no volume"
                mounted.add(mount["name"])
        assert mounted == volumes, f"{deployment['metadata']['name']}: unused volumes {volumes - mounted}"


def test_read_only_root_keeps_writable_cache_and_tmp(objects):
    cache = PurePosixPath(dockerfile_env()["ENCODER_SERVER_CACHE"])
    for deployment, container in all_containers(objects):
        if container["name"] == "seed-cache":
            continue
        name, _ = mount_of(container, "/tmp")  # the server's run folder (ipc sockets) and other temp files
        assert "emptyDir" in volume(deployment, name)
    for command in ("start", "worker"):  # the ones that load the model, through the ONNX cache
        deployment, container, _ = runs(objects, command)
        name, mount = mount_of(container, cache)
        assert "emptyDir" in volume(deployment, name) and not mount.get("readOnly")
        # an init container copies the image's cache into that volume, where the server will look
        (seed,) = [init for init in pod_spec(deployment).get("initContainers", []) if init["name"] == "seed-cache"]
        assert seed["image"] == container["image"]
        program, *flags, source, destination = seed["command"] + seed.get("args", [])
        assert (program, flags, PurePosixPath(source)) == ("cp", ["-a"], cache)
        seed_volume, seed_mount = mount_of(seed, destination)
        assert seed_volume == name and destination.rstrip("/") == seed_mount["mountPath"]
        assert PurePosixPath(mount["mountPath"]) / cache.name == cache, \
            "the copy lands at the mount's top: the cache folder must be straight below it"


def test_image_and_grace_period(objects):
    compose_image = compose_default(yaml.safe_load(COMPOSE.read_text())["x-encoder-image"]["image"])
    drain = next(setting.default for setting in CHOICES if setting.name == "drain_timeout")
    for deployment, container in all_containers(objects):
        assert container["image"] == compose_image and container["image"].split(":")[0] == IMAGE
        assert container.get("imagePullPolicy") == "IfNotPresent", "a :latest image built locally is not pulled"
    for deployment in of_kind(objects, "Deployment"):
        grace = pod_spec(deployment).get("terminationGracePeriodSeconds", 30)
        assert grace >= drain + 5, f"{deployment['metadata']['name']}: {grace} s leaves no time to drain"


# ---- documentation ----------------------------------------------------------------------------

def kubernetes_section():
    text = README.read_text()
    match = re.search(r"^## Kubernetes\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, "docker/README.md has no '## Kubernetes' section"
    return match[1]


def test_every_secret_and_config_map_is_documented(rendered):
    section = kubernetes_section()
    public, secret = keygen_names()
    needed, files = set(), set()  # text the section must hold; key files it must pass to --from-file
    for name in RENDERS:
        for deployment, container in all_containers(rendered[name]):
            for entry in container.get("env", []):
                for kind in ("secretKeyRef", "configMapKeyRef"):
                    ref = entry.get("valueFrom", {}).get(kind)
                    if ref:
                        needed.add(f"kubectl create secret generic {ref['name']}" if kind == "secretKeyRef"
                                   else ref["name"])
                        needed.add(f"{ref['key']}=")
            for source in container.get("envFrom", []):
                needed.update(ref["name"] for ref in (source.get("secretRef"), source.get("configMapRef")) if ref)
        for deployment in of_kind(rendered[name], "Deployment"):
            for source in pod_spec(deployment).get("volumes", []):
                if "secret" in source:
                    needed.add(f"kubectl create secret generic {source['secret']['secretName']}")
                    files.update({public, secret})
                if "configMap" in source:
                    needed.add(source["configMap"]["name"])
    missing = sorted(item for item in needed if item not in section)
    missing += sorted(f"--from-file=...{file}" for file in files
                      if not re.search(rf"--from-file=(\S*/)?{re.escape(file)}(\s|$)", section))
    assert not missing, f"docker/README.md's Kubernetes section does not say: {missing}"


def test_readme_names_the_commands_and_paths(objects):
    section = kubernetes_section()
    for folder in RENDERS.values():
        assert f"kubectl apply -k {folder.relative_to(ROOT)}" in section
    assert "encoder-server keygen" in section
    _, _, server = runs(objects, "start")
    service = server_service(objects)["metadata"]["name"]
    for number in (server.port, server.port_out, server.worker_port, server.worker_port + 1):
        assert str(number) in section
    assert service in section
