"""The `encoder-server` command line: each command's options, one function each. The options of
the server's choices are built from their declarations (settings.Settings: flag, default, help,
bounds), and each may come from an ENCODER_SERVER_<NAME> environment variable instead."""
import argparse
import os

from encoder_client.protocol import DEFAULT_PORT, DEFAULT_PORT_OUT
from encoder_client.version import __version__

from .bulk import MODEL_OPTIONS as BULK_MODEL_OPTIONS
from .gateway.limits import GATEWAY_TIMEOUT, HTTP_LIMITS
from .settings import CHOICES


def build_parser(handlers):
    """The `encoder-server` parser; `handlers` maps each command's name to the function that runs
    it (set as the parsed arguments' `run`)."""
    parser = argparse.ArgumentParser(prog="encoder-server", description="Sentence embeddings over ZeroMQ.")
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(required=True, metavar="{start,stop,status,check,keygen,http,worker,bulk}")
    for name, add_options in COMMANDS.items():
        add_options(commands, name, handlers[name])
    return parser


def _command(commands, name, run, summary, **options):
    command = commands.add_parser(name, help=summary, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                  **options)
    command.set_defaults(run=run)
    return command


def _server_options(commands, name, run):
    """`start` and `check`: every choice Settings declares, in its group."""
    summary = {"start": "start a server in the foreground",
               "check": "start a server with these choices on free ports, encode a built-in sample, and compare "
                        "it with sentence-transformers"}[name]
    command = _command(commands, name, run, summary,
                       epilog="Every option may come from the environment instead: ENCODER_SERVER_ and its name, "
                              "e.g. ENCODER_SERVER_NUM_WORKER=4, ENCODER_SERVER_API_KEY (kept out of `ps`); a flag "
                              "given on the command line wins.")
    groups = {}
    for setting in CHOICES:
        group = setting.metadata["group"]
        if group is not None and group not in groups:
            groups[group] = command.add_argument_group(group)
        _add_choice(groups.get(group, command), setting.name, **SEVERAL_MODELS.get(setting.name, {}))


# `start` and `check` serve several models when --model is given several times
SEVERAL_MODELS = {"model": {"action": "append", "help": "a model folder (Hugging Face or sentence-transformers), or "
                                                        "a Hugging Face id ORG/NAME; given several times, each is "
                                                        "served, the first by default (default: the bundled "
                                                        "all-MiniLM-L6-v2)"}}


def _client_options(commands, name, run):
    """`stop` and `status`: a client of a running server."""
    summary, timeout = {"stop": ("stop a running server gracefully", 30.0),
                        "status": ("print a server's status; exit 0 when ready", 5.0)}[name]
    command = _command(commands, name, run, summary)
    command.add_argument("--host", default="localhost", help="server address")
    _add_server_address(command, timeout)


def _http_options(commands, name, run):
    gateway = _command(commands, name, run, "serve the HTTP gateway (OpenAI and bert-as-service APIs, metrics, "
                                            "status page) for a running server")
    gateway.add_argument("--connect", default="localhost", help="the server's address")
    _add_server_address(gateway, GATEWAY_TIMEOUT, "seconds the gateway waits on the server for any one request "
                                                  "(504 after)")
    gateway.add_argument("--http-host", default="127.0.0.1", help="address to listen on")
    gateway.add_argument("--http-port", type=int, default=8080, help="port to listen on")
    gateway.add_argument("--api-key", default=os.environ.get(env_name("api_key")),
                         help=f"bearer key that embedding requests must carry (or {env_name('api_key')}, which "
                              "`ps` does not show)")
    for name in HTTP_LIMITS:
        _add_choice(gateway, name)
    gateway.add_argument("--verbose", action="store_true", help="debug logging")
    _add_choice(gateway, "log_format")


def _worker_options(commands, name, run):
    workers = _command(commands, name, run, "run workers on this host for a running server (started with "
                                            "--worker-port)")
    workers.add_argument("--connect", required=True, help="the server's address")
    _add_server_address(workers, 30.0)
    _add_choice(workers, "model", help="this host's copy of the served model (default: the bundled all-MiniLM-L6-v2)")
    _add_choice(workers, "num_worker")
    _add_choice(workers, "lanes")
    _add_choice(workers, "threads_per_worker")
    _add_choice(workers, "tokenizer_threads")
    _add_choice(workers, "device", help="where these workers run")
    _add_choice(workers, "backend", help="inference engine (default: the server's, or torch on cuda)")
    _add_choice(workers, "cuda_graphs")
    _add_choice(workers, "verbose")
    _add_choice(workers, "log_format")


def _keygen_options(commands, name, run):
    keys = _command(commands, name, run, "write a CURVE key pair (NAME.key and NAME.key_secret)")
    keys.add_argument("directory", help="folder to write the keys to")
    keys.add_argument("--name", default="server", help="file name of the pair")


def _bulk_options(commands, name, run):
    bulk_job = _command(commands, name, run, "embed a column of a Parquet, JSONL or CSV file into Parquet files, "
                                             "on Ray (the `ray` extra)",
                        epilog="OUTPUT gets part-NNNNN.parquet files (an id column and an `embedding` column of "
                               "float32 lists), each written whole; running the same command again skips the "
                               "finished ones.")
    bulk_job.add_argument("input", help="a .parquet, .jsonl or .csv file (.jsonl and .csv may be compressed)")
    bulk_job.add_argument("output", help="folder for the Parquet shards (created if missing)")
    bulk_job.add_argument("--column", default="text", help="the column holding the texts")
    bulk_job.add_argument("--id-column", help="a column to write beside each embedding (default: `id`, the row "
                                              "number in INPUT, from 0)")
    bulk_job.add_argument("--shard-rows", type=_positive_int, default=10_000, help="rows per output file")
    bulk_job.add_argument("--ray-address", help="an existing Ray cluster (default: start Ray on this host)")
    bulk_job.add_argument("--actors", type=_positive_int, help="embedding actors (default: the cluster's CPUs / "
                                                               "--cpus-per-actor)")
    bulk_job.add_argument("--cpus-per-actor", type=float, help="CPUs of each actor, its model's threads (default 1; "
                                                               "0.25 with --connect)")
    bulk_job.add_argument("--connect", help="embed through a running server at this address instead of a model in "
                                            "each actor")
    _add_server_address(bulk_job, 600.0)
    for name in BULK_MODEL_OPTIONS:
        _add_choice(bulk_job, name)
    bulk_job.add_argument("--quiet", action="store_true", help="no progress bar")


# each command's options, in the order `encoder-server --help` lists them
COMMANDS = {"start": _server_options, "stop": _client_options, "status": _client_options, "check": _server_options,
            "keygen": _keygen_options, "http": _http_options, "worker": _worker_options, "bulk": _bulk_options}


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _add_choice(parser, name, **overrides):
    """The option of the setting `name`, as settings.Settings declares it (flag, default, help, bounds);
    its default comes from the environment variable ENCODER_SERVER_<NAME> when that is set."""
    setting = next(setting for setting in CHOICES if setting.name == name)
    bounds = setting.metadata
    options = {"dest": name, "default": _env_default(setting), "help": bounds["help"]}
    if setting.type is bool:
        options["action"] = "store_true" if setting.default is False else argparse.BooleanOptionalAction
    elif bounds.get("action"):
        options["action"] = bounds["action"]
    else:
        options.update(type=bounds.get("parse", setting.type), nargs=bounds.get("nargs"),
                       choices=bounds.get("choices"))
    parser.add_argument("--" + name.replace("_", "-"), **{**options, **overrides})


def env_name(name):
    return f"ENCODER_SERVER_{name.upper()}"


def _env_default(setting):
    """The setting's default, or the value of its environment variable, read as the flag would be."""
    value = os.environ.get(env_name(setting.name))
    if value is None:
        return setting.default
    if setting.type is bool:
        if value.lower() not in BOOLEAN_WORDS:
            raise SystemExit(f"encoder-server: error: {env_name(setting.name)}={value!r}: use one of "
                             f"{', '.join(BOOLEAN_WORDS)}")
        return BOOLEAN_WORDS[value.lower()]
    if setting.metadata.get("nargs") or setting.metadata.get("action") == "append":
        parse = setting.metadata.get("parse", str)
        try:
            return [parse(item) for item in value.replace(",", " ").split()]
        except (ValueError, argparse.ArgumentTypeError):
            raise SystemExit(f"encoder-server: error: {env_name(setting.name)}={value!r} is not valid") from None
    return value  # argparse reads a string default with the option's type, as if it were given


BOOLEAN_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
                 "off": False}


def _add_server_address(command, timeout, timeout_help="seconds to wait for the server"):
    command.add_argument("--port", type=int, default=DEFAULT_PORT, help="server's request port")
    command.add_argument("--port-out", type=int, default=DEFAULT_PORT_OUT, help="server's result port")
    command.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
    command.add_argument("--server-key", default=None, help="the server's public .key file, when it uses CURVE")
    command.add_argument("--client-key", default=None, help="this client's .key_secret file, when it uses CURVE")
