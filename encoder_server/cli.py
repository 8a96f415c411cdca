"""The `encoder-server` command: start, stop, status, check (parity with sentence-transformers),
keygen, http (a gateway to a running server) and worker (workers on another host that join a
running server)."""
import json
import os
import socket
import sys
import time

from .gateway.limits import HTTP_LIMITS
from .logs import LOG_FORMAT_VARIABLE
from .model.model_folder import ConfigError
from .options import build_parser


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
    from .gateway.children import HTTP_CHILDREN
    from .logs import configure_logging
    from .server.supervisor import Supervisor
    from .settings import resolve

    log = configure_logging("supervisor", args.verbose)
    settings = resolve(**_start_choices(args))
    for model in settings.all_models:
        _log_model(log, model)
    return Supervisor(settings, HTTP_CHILDREN).serve()


def _log_model(log, model):
    names = f" (also {', '.join(model.model_name[1:])})" if len(model.model_name) > 1 else ""
    log.info("model %s%s: %s, %d layers, max_seq_len %s", model.name, names, model.model, model.num_layers,
             model.max_seq_len)
    if model.kind == "rerank":
        log.info("reranks (query, document) pairs: one score each, through %s",
                 model.score_activation.rsplit(".", 1)[-1])
    elif model.kind == "sparse":
        log.info("sparse: SPLADE %s pooling over %d vocabulary entries%s", model.splade_pooling, model.embedding_dim,
                 f", {model.max_active_dims} kept a row" if model.max_active_dims else "")
    else:
        head = "".join(f" + {layer.describe()}" for layer in model.head)
        log.info("pooling: %s%s (%s), %d floats per embedding", model.pooling.describe(), head, model.pooling_source,
                 model.embedding_dim)
    for override in model.overrides:
        log.warning("%s", override)
    log.info("%d worker(s) on %s, %d lane(s) of %d thread(s) each, %d thread(s) tokenizing", model.num_worker,
             model.device, model.lanes, model.threads_per_worker, model.tokenizer_threads)


def check(args):
    from .parity_check import check as run_check

    return run_check(args.argv[1:], _start_choices(args))


def _start_choices(args):
    return {name: value for name, value in vars(args).items() if name not in ("run", "argv")}


def http(args):
    from .gateway.serve import serve_http

    return serve_http(args.http_host, args.http_port, args.connect, args.port, args.port_out,
                      server_key=args.server_key, client_key=args.client_key, api_key=args.api_key,
                      verbose=args.verbose, timeout=args.timeout, limits=http_limits(args))


def http_limits(values):
    """The gateway's connection limits, by name, from `values` (Settings or the `http` command's
    arguments), checked against their declared bounds (ConfigError)."""
    from .model.spec import check_bounds
    from .settings import Settings

    limits = {name: getattr(values, name) for name in HTTP_LIMITS}
    check_bounds(Settings(**limits))
    return limits


def worker(args):
    from .server.remote_worker import join_server

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
    return build_parser({"start": start, "stop": stop, "status": status, "check": check, "keygen": keygen,
                         "http": http, "worker": worker, "bulk": bulk})


if __name__ == "__main__":
    sys.exit(main())
