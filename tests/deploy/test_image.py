"""The CPU images, built from docker/Dockerfile with podman and run for real: a lean image that
serves like a local server, as uid 10001 on a read-only root, joins remote workers over CURVE and
drains a request in flight when stopped; the full target serving the torch backend; and
docker/compose.yaml run by podman-compose.

The base is Debian 12's python3 made by docker/debian-base.sh (no image registry is reachable here).
The host's pip settings reach the build as mounts (a pip.conf, its CA bundle and wheel folder), never
through the Dockerfile. The build keeps podman's layer cache between runs, less what earlier builds
made that the last one did not use; its time and the image's size are reported at the end of the
run. Skipped, saying why, only where podman cannot run at all.
"""
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from conftest import free_port, random_texts, running_server
from encoder_client import EncoderClient
from encoder_server.model.model_folder import default_model_path

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/bookworm-python:3.11"
IMAGE = "localhost/encoder-server:test"
FULL_IMAGE = "localhost/encoder-server:test-full"
STAGE_LABEL = "org.opencontainers.image.title=encoder-server"  # what docker/Dockerfile labels every stage with
SIZE_LIMIT_MB = 600
START_TIMEOUT = 180
MODEL_NAME = "all-MiniLM-L6-v2"
TEXTS = [*random_texts(96, seed=27, min_words=1, max_words=60), "naïve café — 東京 🙂", "x" * 3000,
         "tab\there\nnewline"]

pytestmark = pytest.mark.timeout(1200)


# ---- podman, as this host needs it --------------------------------------------------------

@pytest.fixture(scope="module")
def podman():
    """The podman command line: runc where installed (podman's default crun refuses hosts with
    hybrid cgroups, like the development machine)."""
    found = shutil.which("podman")
    if found is None:
        pytest.skip("podman is not installed (tests/system-packages.sh installs it with runc and mmdebstrap)")
    runc = shutil.which("runc")
    command = [found, *(["--runtime", runc] if runc else [])]
    probe = subprocess.run([*command, "info"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run on this machine: {(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    return command


def limits():
    """--ulimit flags within the host's hard limits (podman's defaults exceed this host's)."""
    flags = []
    for name, limit, most in (("nofile", resource.RLIMIT_NOFILE, 1 << 20), ("nproc", resource.RLIMIT_NPROC, 4096)):
        hard = resource.getrlimit(limit)[1]
        value = most if hard == resource.RLIM_INFINITY else min(hard, most)
        flags += ["--ulimit", f"{name}={value}:{value}"]
    return flags


def run(command, timeout=600, check=True):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail(f"`{' '.join(command[:6])} ...` exited with {result.returncode}:\n{result.stderr[-4000:]}")
    return result


def pip_settings():
    """This host's pip `cert` and `find-links` (a CA bundle, a local wheel folder), as pip reads them."""
    listed = run([sys.executable, "-m", "pip", "config", "list"]).stdout.splitlines()
    wanted = {}
    for key, value in (line.split("=", 1) for line in listed if "=" in line):
        name = key.split(".", 1)[1]
        if name in ("cert", "find-links"):
            wanted[name] = value.strip("'\"")
    return wanted


def pip_mounts(settings, folder):
    """-v flags mounting a pip.conf with `settings`, and the files and folders they name, read-only
    into the build."""
    conf = folder / "pip.conf"
    conf.write_text("[global]\n" + "".join(f"{name} = {value}\n" for name, value in settings.items()))
    mounts = ["-v", f"{conf}:/etc/pip.conf:ro"]
    for path in " ".join(settings.values()).split():
        if Path(path).exists():
            mounts += ["-v", f"{path}:{path}:ro"]
    return mounts


def torch_version(settings):
    """The pinned torch's version, with the local label of a wheel for it in pip's find-links
    (2.13.0+cpu), so that the build takes that wheel rather than PyPI's CUDA build."""
    pinned = re.search(r'"torch==([^"]+)"', (ROOT / "setup.py").read_text()).group(1)
    for folder in settings.get("find-links", "").split():
        for wheel in sorted(Path(folder).glob(f"torch-{pinned}+*.whl")) if Path(folder).is_dir() else ():
            return wheel.name.split("-")[1]
    return pinned


# ---- the image ----------------------------------------------------------------------------

def build(podman, tmp_path_factory, target, tag):
    """Build `target` of docker/Dockerfile from this checkout as `tag`; (tag, seconds the build
    took, size in MB). One build at a time across the test processes; a second one reuses the
    first's layers."""
    shared = tmp_path_factory.getbasetemp().parent
    with FileLock(str(shared / "image-build.lock")):
        if run([*podman, "image", "exists", BASE], check=False).returncode != 0:
            run(["bash", str(ROOT / "docker" / "debian-base.sh"), BASE])
        superseded = image_id(podman, tag)
        started = time.monotonic()
        settings = pip_settings()
        # --format docker: the OCI format that podman writes by default has no HEALTHCHECK
        built = run([*podman, "build", "--format", "docker", "--jobs", "2", "--network", "host", *limits(),
                     *pip_mounts(settings, tmp_path_factory.mktemp("pip")), "--target", target,
                     "--build-arg", f"BASE_IMAGE={BASE}", "--build-arg", "TORCH_INDEX_URL=https://pypi.org/simple",
                     "--build-arg", f"TORCH_VERSION={torch_version(settings)}",
                     "-f", str(ROOT / "docker" / "Dockerfile"), "-t", tag, str(ROOT)], timeout=1500)
        seconds = time.monotonic() - started
        if superseded not in (None, image_id(podman, tag)):  # the last run's image, now untagged: its own layers go
            run([*podman, "rmi", superseded], check=False)
        if target == "runtime":  # the default target, which every stage goes into
            remove_stale_stages(podman, built.stdout)
    size = json.loads(run([*podman, "image", "inspect", tag]).stdout)[0]["Size"] / 1e6
    return tag, seconds, size


def remove_stale_stages(podman, build_output):
    """Remove the Dockerfile's untagged images (earlier builds' stages: half a GB for each change of
    the sources) that the build which printed `build_output` did not use; those with children stay
    (podman refuses to remove them). Fails if more remain than the Dockerfile has stages."""
    used = re.findall(r"^--> (?:Using cache )?([0-9a-f]{11,64})$", build_output, re.MULTILINE)
    stale = [image for image in untagged_stages(podman)
             if not any(image.removeprefix("sha256:").startswith(prefix) for prefix in used)]
    if stale:
        run([*podman, "rmi", *stale], check=False)
    stages = len(re.findall(r"^FROM ", (ROOT / "docker" / "Dockerfile").read_text(), re.MULTILINE))
    left = untagged_stages(podman)
    assert len(left) <= stages, f"{len(left)} untagged images of the Dockerfile's stages are left: {left}"


def untagged_stages(podman):
    """The ids of the untagged images that docker/Dockerfile's stages made and no image builds on."""
    return run([*podman, "images", "--all", "--quiet", "--no-trunc", "--filter", "dangling=true",
                "--filter", f"label={STAGE_LABEL}"]).stdout.split()


def image_id(podman, tag):
    """The id of the image `tag` names, or None."""
    result = run([*podman, "image", "inspect", "--format", "{{.Id}}", tag], check=False)
    return result.stdout.strip() if result.returncode == 0 else None


@pytest.fixture(scope="module")
def image(podman, tmp_path_factory):
    return build(podman, tmp_path_factory, "runtime", IMAGE)


@pytest.fixture(scope="module")
def full_image(podman, tmp_path_factory, image):
    return build(podman, tmp_path_factory, "full", FULL_IMAGE)


def test_the_runtime_image_is_lean_unprivileged_and_has_the_export(podman, image, record_property):
    name, seconds, size_mb = image
    record_property("report", f"container image {name}: built in {seconds:.0f} s, {size_mb:.0f} MB")
    assert size_mb <= SIZE_LIMIT_MB, f"{size_mb:.0f} MB"
    inspected = json.loads(run([*podman, "image", "inspect", name]).stdout)[0]
    assert inspected["Config"]["User"] == "10001:10001"
    assert "/ready" in " ".join(inspected["Healthcheck"]["Test"])
    # on a read-only root: the lookup takes no lock, and finds the export that torch made at build time
    probe = ("import importlib.util as u; from encoder_server.model.model_cache import served_file_if_cached as f; "
             "from encoder_server.model.spec import ModelSpec, resolve_spec as r; "
             "print([m for m in ('torch', 'transformers', 'onnx', 'sentence_transformers') if u.find_spec(m)]); "
             "print(f(r(ModelSpec())))")
    listed = run([*podman, "run", "--rm", "--read-only", *limits(), "--entrypoint", "python3", name, "-c", probe])
    carried, served = listed.stdout.splitlines()[:2]
    assert carried == "[]", f"the runtime image carries {carried}"
    assert served.startswith("/home/encoder/.cache/encoder-server/") and served.endswith("/model.onnx"), \
        listed.stdout + listed.stderr
    # what needs torch says so, and names the full target
    for options in (["--backend", "torch"], ["--pooling-strategy", "cls"]):
        refused = run([*podman, "run", "--rm", "--read-only", *limits(), name, "start", "--num-worker", "1",
                       "--port", str(free_port()), "--port-out", str(free_port()), *options], timeout=120, check=False)
        assert refused.returncode != 0 and "full target" in refused.stderr + refused.stdout, \
            f"{options}: {refused.returncode}\n{refused.stdout[-2000:]}{refused.stderr[-2000:]}"


# ---- containers ---------------------------------------------------------------------------

@pytest.fixture
def containers(podman):
    """`start(*podman_run_args)` starts a container on the host's network and returns its name;
    each is removed at the end."""
    started = []

    def start(*args):
        name = f"encoder-test-{uuid.uuid4().hex[:8]}"
        run([*podman, "run", "-d", "--name", name, "--network", "host", *limits(), *args])
        started.append(name)
        return name

    yield start
    for name in started:
        subprocess.run([*podman, "rm", "-f", "-t", "0", name], capture_output=True, timeout=60)


def logs(podman, name):
    result = run([*podman, "logs", name], check=False)
    return (result.stdout + result.stderr)[-6000:]


def wait_healthy(podman, name):
    """Run the image's own health check until it passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while run([*podman, "healthcheck", "run", name], check=False).returncode != 0:
        state = json.loads(run([*podman, "inspect", name]).stdout)[0]["State"]
        assert state["Running"], f"the container exited with {state['ExitCode']}:\n{logs(podman, name)}"
        assert time.monotonic() < deadline, f"not healthy within {START_TIMEOUT} s:\n{logs(podman, name)}"
        time.sleep(1)


def container_uids(podman, name):
    """The real uid of every process in the container, read from the host's /proc."""
    pids = run([*podman, "top", name, "hpid"]).stdout.split()[1:]
    uids = set()
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        uids.add(int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1]))
    return uids


@pytest.fixture
def keys(tmp_path):
    """A CURVE key pair from `encoder-server keygen`, readable by the container's uid."""
    folder = tmp_path / "keys"
    run([sys.executable, "-m", "encoder_server.cli", "keygen", str(folder)])
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # a test's throwaway pair; never do this to real keys
    return folder


def cosines(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_the_full_image_serves_the_torch_backend_like_sentence_transformers(podman, full_image, containers,
                                                                          record_property):
    name, seconds, size_mb = full_image
    record_property("report", f"container image {name} (--target full): built in {seconds:.0f} s, {size_mb:.0f} MB")
    port, port_out = free_port(), free_port()
    # a writable tmpfs for the cache, where the full image may build exports at run time
    server = containers("--read-only", "--tmpfs", "/home/encoder/.cache/encoder-server:rw,mode=1777",
                        "-e", f"ENCODER_SERVER_HTTP_PORT={free_port()}", name,
                        "start", "--host", "127.0.0.1", "--port", str(port), "--port-out", str(port_out),
                        "--backend", "torch", "--num-worker", "1")
    wait_healthy(podman, server)
    with EncoderClient("127.0.0.1", port, port_out, timeout=60) as client:
        rows = client.encode(TEXTS)
        assert client.server_config["backend"] == "torch"
    from sentence_transformers import SentenceTransformer
    reference = SentenceTransformer(str(default_model_path()), device="cpu").encode(TEXTS)
    assert cosines(rows, reference).min() >= 0.9999


def test_the_container_serves_joins_a_remote_worker_and_drains_on_stop(podman, image, containers, keys, tmp_path):
    port, port_out, http_port, worker_port = free_port(), free_port(), free_port(), free_port(consecutive=2)
    curve = {"server_key": str(keys / "server.key"), "client_key": str(keys / "server.key_secret")}
    inside = "/home/encoder/keys"
    server = containers(
        # the gateway's port from the variable the image's health check reads too
        "--read-only", "-v", f"{keys}:{inside}:ro", "-e", f"ENCODER_SERVER_HTTP_PORT={http_port}", image[0],
        "start", "--host", "127.0.0.1", "--port", str(port), "--port-out", str(port_out),
        "--worker-port", str(worker_port), "--num-worker", "1", "--threads-per-worker", "1",
        "--server-key", f"{inside}/server.key_secret", "--authorized-clients", inside)
    wait_healthy(podman, server)
    assert container_uids(podman, server) == {10001}

    with running_server(default_model_path(), "--num-worker", "1", tmp_path=tmp_path / "local") as local, \
            local.client() as client:
        expected = client.encode(TEXTS)
    with EncoderClient("127.0.0.1", port, port_out, timeout=60, **curve) as client:
        over_zmq = client.encode(TEXTS)
    assert cosines(over_zmq, expected).min() >= 0.9999

    import openai
    http = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0, timeout=60)
    response = http.embeddings.create(model=MODEL_NAME, input=TEXTS)
    over_http = np.array([row.embedding for row in response.data], dtype=np.float32)
    assert cosines(over_http, expected).min() >= 0.9999

    # a second container, a remote worker on the first one's queues over CURVE
    containers("--read-only", "--hostname", "remote-box", "-v", f"{keys}:{inside}:ro", image[0],
               "worker", "--connect", "127.0.0.1", "--port", str(port), "--port-out", str(port_out),
               "--threads-per-worker", "1",
               "--server-key", f"{inside}/server.key", "--client-key", f"{inside}/server.key_secret")
    with EncoderClient("127.0.0.1", port, port_out, timeout=60, **curve) as client:
        deadline = time.monotonic() + START_TIMEOUT
        while not any(name.startswith("remote-box/") for name in client.server_status["worker_busy_texts"]):
            assert time.monotonic() < deadline, f"the remote worker never joined: {client.server_status}"
            time.sleep(0.5)
        shared = client.encode(random_texts(2000, seed=28, min_words=3, max_words=30))
        encoded = client.server_status["worker_texts_encoded"]
    assert shared.shape == (2000, 384)
    remote = {name: count for name, count in encoded.items() if name.startswith("remote-box/")}
    assert remote and min(remote.values()) > 0, f"the remote worker encoded nothing: {encoded}"

    # podman stop with a request in flight: the request completes, the container exits with 0
    in_flight = random_texts(1000, seed=29, min_words=2, max_words=12)
    result = {}

    def encode():
        with EncoderClient("127.0.0.1", port, port_out, timeout=60, **curve) as client:
            result["rows"] = client.encode(in_flight)

    sender = threading.Thread(target=encode)
    sender.start()
    time.sleep(0.5)
    assert sender.is_alive(), "the request finished before the stop: nothing was in flight"
    stopped = time.monotonic()
    run([*podman, "stop", "--time", "15", server], timeout=60)
    sender.join(30)
    assert result.get("rows") is not None and result["rows"].shape == (1000, 384), logs(podman, server)
    state = json.loads(run([*podman, "inspect", server]).stdout)[0]["State"]
    assert state["ExitCode"] == 0, f"exit code {state['ExitCode']} after {time.monotonic() - stopped:.1f} s:\n" \
                                   f"{logs(podman, server)}"


# ---- docker/compose.yaml, with podman-compose ------------------------------------------------

def test_compose_runs_server_gateway_and_worker_with_shared_keys(podman, image, tmp_path):
    """podman-compose runs docker/compose.yaml on the image just built (`up --no-build`: the file's
    own build would pull python:3.11-slim-bookworm): the keys service writes the pair, the server takes
    a remote worker from the worker service over CURVE, and clients reach it on the published ports."""
    compose = shutil.which("podman-compose")
    if compose is None:
        pytest.fail("podman-compose is missing: run tests/system-packages.sh")
    project = f"encoder-test-{uuid.uuid4().hex[:8]}"
    port, port_out, http_port = free_port(), free_port(), free_port()
    env = {**os.environ, "ENCODER_IMAGE": image[0], "ENCODER_PORT": str(port), "ENCODER_PORT_OUT": str(port_out),
           "ENCODER_HTTP_PORT": str(http_port)}
    podman_args = [f"--podman-args={' '.join(podman[1:])}"] if len(podman) > 1 else []  # the runtime
    command = [compose, "-p", project, *podman_args, f"--podman-run-args={' '.join(limits())}",
               "-f", str(ROOT / "docker" / "compose.yaml")]

    def compose_run(*args, check=True):
        result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=300, env=env)
        assert not check or result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    try:
        compose_run("up", "-d", "--no-build")
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/ready", timeout=3):
                    break
            except OSError:
                assert time.monotonic() < deadline, \
                    f"the gateway never got ready:\n{logs(podman, project + '_server_1')}"
                time.sleep(1)
        run([*podman, "cp", f"{project}_server_1:/home/encoder/keys", str(tmp_path)])  # the shared volume
        curve = {"server_key": str(tmp_path / "keys" / "server.key"),
                 "client_key": str(tmp_path / "keys" / "server.key_secret")}
        with EncoderClient("127.0.0.1", port, port_out, timeout=60, **curve) as client:
            deadline = time.monotonic() + START_TIMEOUT
            while not any("/worker-" in name for name in client.server_status["worker_busy_texts"]):
                assert time.monotonic() < deadline, f"the worker service never joined: {client.server_status}"
                time.sleep(0.5)
            over_zmq = client.encode(random_texts(600, seed=30, min_words=3, max_words=30))
            encoded = client.server_status["worker_texts_encoded"]
        remote = {name: count for name, count in encoded.items() if "/worker-" in name}
        assert remote and sum(remote.values()) > 0, f"the worker service encoded nothing: {encoded}"
        import openai
        http = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)
        response = http.embeddings.create(model=MODEL_NAME, input=random_texts(600, seed=30, min_words=3, max_words=30))
        over_http = np.array([row.embedding for row in response.data], dtype=np.float32)
        assert cosines(over_http, over_zmq).min() >= 0.9999
        compose_run("stop", "-t", "15")
        for service in ("server", "gateway", "worker"):
            state = json.loads(run([*podman, "inspect", f"{project}_{service}_1"]).stdout)[0]["State"]
            assert state["ExitCode"] == 0, f"{service} exited with {state['ExitCode']}:\n" \
                                           f"{logs(podman, f'{project}_{service}_1')}"
    finally:
        compose_run("down", "-v", "-t", "0", check=False)
        networks = compose_networks(podman, project)  # podman-compose's `down` leaves them: a bridge per run
        if networks:
            run([*podman, "network", "rm", "-f", *networks], check=False)
    assert not compose_networks(podman, project), "the compose project's network outlived it"


def compose_networks(podman, project):
    """The names of the networks podman-compose made for `project` (none when podman cannot list them)."""
    return run([*podman, "network", "ls", "--format", "{{.Name}}", "--filter",
                f"label=io.podman.compose.project={project}"], check=False).stdout.split()
