"""The `encoder-server` command: start, stop, status, check (parity with sentence-transformers),
keygen, http (a gateway to a running server) and worker (workers on another host that join a
running server)."""
import argparse
import json
import os
import socket
import sys
import time

from . import __version__
from .model_folder import ConfigError
from .runtime import LOG_FORMAT_VARIABLE
from .settings import CHOICES, GATEWAY_TIMEOUT, HTTP_LIMITS



def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    args.argv = argv
    if getattr(args, "log_format", None):
        os.environ[LOG_FORMAT_VARIABLE] = args.log_format  # every process's configure_logging reads it
    try:
        return args.run(args)
    except ConfigError as error:
        print(f"encoder-server: error: {error}", file=sys.stderr)
        return 2
    except (TimeoutError, PermissionError) as error:
        print(f"encoder-server: {error}", file=sys.stderr)
        return 1


def start(args):
    from .runtime import configure_logging
    from .settings import resolve
    from .supervisor import Supervisor

    log = configure_logging("supervisor", args.verbose)
    settings = resolve(**_start_choices(args))
    log.info("model %s (%s): %d layers, max_seq_len %s", settings.model_name[0], settings.model, settings.num_layers,
             settings.max_seq_len)
    head = "".join(f" + {layer.describe()}" for layer in settings.head)
    log.info("pooling: %s%s (%s), %d floats per embedding", settings.pooling.describe(), head,
             settings.pooling_source, settings.embedding_dim)
    for override in settings.overrides:
        log.warning("%s", override)
    log.info("%d worker(s) on %s, %d thread(s) each", settings.num_worker, settings.device,
             settings.threads_per_worker)
    return Supervisor(settings).serve()


def check(args):
    from .parity_check import check as run_check

    return run_check(args.argv[1:], _start_choices(args))


def _start_choices(args):
    return {name: value for name, value in vars(args).items() if name not in ("run", "argv")}


def http(args):
    from .gateway import serve_http
    from .settings import http_limits

    return serve_http(args.http_host, args.http_port, args.connect, args.port, args.port_out,
                      server_key=args.server_key, client_key=args.client_key, api_key=args.api_key,
                      verbose=args.verbose, timeout=args.timeout, limits=http_limits(args))


def worker(args):
    from .remote_worker import join_server

    return join_server(args)


def bulk(args):
    try:
        from .bulk.command import bulk as run_bulk
    except ImportError as error:
        print(f"encoder-server bulk needs Ray Data and pyarrow ({error}): pip install 'encoder-server[ray]'",
              file=sys.stderr)
        return 2
    return run_bulk(args)


def _client(args):
    from encoder_client import EncoderClient

    return EncoderClient(args.host, args.port, args.port_out, timeout=args.timeout, server_key=args.server_key,
                         client_key=args.client_key)


def stop(args):
    with _client(args) as client:
        client.shutdown_server()
    deadline = time.monotonic() + args.timeout
    while _port_open(args.host, args.port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server at {args.host}:{args.port} accepted the stop request "
                               f"but was still running after {args.timeout:g}s")
        time.sleep(0.1)
    print(f"encoder-server at {args.host}:{args.port} stopped")
    return 0


def status(args):
    from encoder_client.status import StatusError, check_status

    with _client(args) as client:
        report = client.server_status
    print(json.dumps(report, indent=2))
    try:
        return 0 if check_status(report)["ready"] else 1
    except StatusError as error:
        print(f"encoder-server: the server's status does not follow this version's: {error}", file=sys.stderr)
        return 1


def keygen(args):
    from .security import keygen as write_keys

    try:
        public, secret, written = write_keys(args.directory, args.name)
    except ValueError as error:
        raise ConfigError(f"{args.directory}: {error}") from None
    kept = "" if written else " (these existed already and were kept)"
    print(f"public key: {public}\nsecret key: {secret} (keep it private){kept}")
    return 0


def _port_open(host, port):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _parser():
    parser = argparse.ArgumentParser(prog="encoder-server", description="Sentence embeddings over ZeroMQ.")
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(required=True, metavar="{start,stop,status,check,keygen,http,worker,bulk}")

    for name, handler, summary in (("start", start, "start a server in the foreground"),
                                   ("check", check, "start a server with these choices on free ports, encode a "
                                                    "built-in sample, and compare it with sentence-transformers")):
        run = commands.add_parser(name, help=summary, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                  epilog="Every option may come from the environment instead: ENCODER_SERVER_ and its "
                                         "name, e.g. ENCODER_SERVER_NUM_WORKER=4, ENCODER_SERVER_API_KEY (kept out of "
                                         "`ps`); a flag given on the command line wins.")
        run.set_defaults(run=handler)
        groups = {}
        for setting in CHOICES:
            group = setting.metadata["group"]
            if group is not None and group not in groups:
                groups[group] = run.add_argument_group(group)
            _add_choice(groups.get(group, run), setting.name)

    for name, handler, summary, timeout in (("stop", stop, "stop a running server gracefully", 30.0),
                                            ("status", status, "print a server's status; exit 0 when ready", 5.0)):
        command = commands.add_parser(name, help=summary, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        command.set_defaults(run=handler)
        command.add_argument("--host", default="localhost", help="server address")
        _add_server_address(command, timeout)

    gateway = commands.add_parser("http", help="serve the HTTP gateway (OpenAI and bert-as-service APIs, metrics, "
                                  "status page) for a running server",
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    gateway.set_defaults(run=http)
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

    workers = commands.add_parser("worker", help="run workers on this host for a running server (started with "
                                  "--worker-port)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    workers.set_defaults(run=worker)
    workers.add_argument("--connect", required=True, help="the server's address")
    _add_server_address(workers, 30.0)
    _add_choice(workers, "model", help="this host's copy of the served model (default: the bundled all-MiniLM-L6-v2)")
    _add_choice(workers, "num_worker", help="worker processes (default: one per core)")
    _add_choice(workers, "threads_per_worker")
    _add_choice(workers, "device", help="where these workers run")
    _add_choice(workers, "backend", help="inference engine (default: the server's, or torch on cuda)")
    _add_choice(workers, "verbose")
    _add_choice(workers, "log_format")

    _add_bulk(commands)

    keys = commands.add_parser("keygen", help="write a CURVE key pair (NAME.key and NAME.key_secret)",
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    keys.set_defaults(run=keygen)
    keys.add_argument("directory", help="folder to write the keys to")
    keys.add_argument("--name", default="server", help="file name of the pair")
    return parser


def _add_bulk(commands):
    bulk_job = commands.add_parser(
        "bulk", help="embed a column of a Parquet, JSONL or CSV file into Parquet files, on Ray (the `ray` extra)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="OUTPUT gets part-NNNNN.parquet files (an id column and an `embedding` column of float32 lists), "
               "each written whole; running the same command again skips the finished ones.")
    bulk_job.set_defaults(run=bulk)
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
    for name in ("model", "pooling_strategy", "pooling_layer", "max_seq_len", "normalize", "quantize", "backend"):
        _add_choice(bulk_job, name)
    bulk_job.add_argument("--quiet", action="store_true", help="no progress bar")


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
    command.add_argument("--port", type=int, default=5555, help="server's request port")
    command.add_argument("--port-out", type=int, default=5556, help="server's result port")
    command.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
    command.add_argument("--server-key", default=None, help="the server's public .key file, when it uses CURVE")
    command.add_argument("--client-key", default=None, help="this client's .key_secret file, when it uses CURVE")


if __name__ == "__main__":
    sys.exit(main())
