"""The `encoder-server` command: start, stop, status, keygen, http (a gateway to a running server)
and worker (workers on another host that join a running server)."""
import argparse
import json
import socket
import sys
import time

from . import __version__
from .model_folder import ConfigError
from .settings import STRATEGIES

DEFAULTS = "(default: %(default)s)"


def main(argv=None):
    args = _parser().parse_args(argv)
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
    options = {k: v for k, v in vars(args).items() if k not in ("run", "model_dir")}
    settings = resolve(model=args.model_dir, **options)
    log.info("model %s: %d layers, max_seq_len %s", settings.model, settings.num_layers, settings.max_seq_len)
    log.info("pooling: %s (%s)", settings.pooling.describe(), settings.pooling_source)
    log.info("%d worker(s) on %s, %d thread(s) each", settings.num_worker, settings.device,
             settings.threads_per_worker)
    return Supervisor(settings).serve()


def http(args):
    from .gateway import serve_http

    return serve_http(args.http_host, args.http_port, args.connect, args.port, args.port_out,
                      server_key=args.server_key, client_key=args.client_key, api_key=args.api_key,
                      verbose=args.verbose, timeout=args.timeout)


def worker(args):
    from .remote_worker import join_server

    return join_server(args)


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
    with _client(args) as client:
        report = client.server_status
    print(json.dumps(report, indent=2))
    return 0 if report.get("ready") else 1


def keygen(args):
    from .security import keygen as write_keys

    public, secret = write_keys(args.directory, args.name)
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0


def _port_open(host, port):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _max_seq_len(value):
    if value.lower() in ("none", "auto"):
        return None if value.lower() == "none" else "auto"
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither an integer nor 'none'") from None


def _parser():
    parser = argparse.ArgumentParser(prog="encoder-server", description="Sentence embeddings over ZeroMQ.")
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(required=True, metavar="{start,stop,status,keygen,http,worker}")

    run = commands.add_parser("start", help="start a server in the foreground",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run.set_defaults(run=start)
    model = run.add_argument_group("model and pooling")
    model.add_argument("--model", dest="model_dir", default=None,
                       help="local Hugging Face model folder (default: the bundled all-MiniLM-L6-v2)")
    model.add_argument("--pooling-strategy", choices=STRATEGIES, default=None,
                       help="how token vectors become one vector (default: the model folder's "
                            "sentence-transformers pooling, else mean)")
    model.add_argument("--pooling-layer", type=int, nargs="+", default=None,
                       help="hidden layer(s) to pool, negative from the top, 0 = embeddings; several are "
                            "concatenated (default: -1 for sentence-transformers folders, else -2)")
    model.add_argument("--mask-cls-sep", action="store_true", help="leave [CLS] and [SEP] out of the pooling")
    model.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                       help="L2-normalise each embedding (default: as the model folder's Normalize module says)")
    model.add_argument("--max-seq-len", type=_max_seq_len, default="auto",
                       help="tokens kept per text, or 'none' for the model's limit with padding to the longest "
                            "text of each batch; 'auto' takes sentence-transformers' max_seq_length, else the "
                            "model's limit")
    model.add_argument("--show-tokens-to-client", action="store_true",
                       help="allow clients to ask for their WordPiece tokens")

    compute = run.add_argument_group("compute")
    compute.add_argument("--backend", choices=("onnx", "torch"), default=None,
                         help="inference engine (default: onnx on cpu, torch on cuda)")
    compute.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where workers run the model")
    compute.add_argument("--fp16", action="store_true", help="half precision (CUDA only)")
    compute.add_argument("--quantize", choices=("int8",), default=None,
                         help="dynamic int8 weights (onnx on cpu), served only if it passes the accuracy check")
    compute.add_argument("--min-quant-cosine", type=float, default=0.99,
                         help="refuse int8 when its mean row cosine against fp32 on a built-in sample is lower")
    compute.add_argument("--num-worker", type=int, default=None,
                         help="worker processes (default: one per CPU core, or 1 on cuda)")
    compute.add_argument("--threads-per-worker", type=int, default=None,
                         help="intra-op threads per worker lane (default: cores / workers, so none are "
                              "oversubscribed)")

    scheduling = run.add_argument_group("scheduling")
    scheduling.add_argument("--priority-batch-size", type=int, default=16,
                            help="requests of at most this many texts go to the high-priority queue, "
                                 "spread over the idle workers")
    scheduling.add_argument("--max-batch-size", type=int, default=64,
                            help="larger requests are split into jobs of at most this many texts; also the "
                                 "row cap of one forward pass")
    scheduling.add_argument("--max-batch-tokens", type=int, default=None,
                            help="cap on padded tokens (texts x longest) in one forward pass "
                                 "(default: 1024 on cpu, 16384 on cuda)")
    scheduling.add_argument("--batch-wait-ms", type=float, default=0.0,
                            help="how long small requests may wait for others to share their forward pass")
    scheduling.add_argument("--prefetch-size", type=int, default=2,
                            help="bulk jobs a worker receives and tokenizes ahead of the model")
    scheduling.add_argument("--graceful-timeout", type=float, default=30.0,
                            help="seconds that in-flight requests get to finish on stop")
    scheduling.add_argument("--max-pending-texts", type=int, default=100_000,
                            help="texts of unfinished requests the server holds; a request past it gets "
                                 "an immediate 'server busy' error")
    scheduling.add_argument("--max-request-mb", type=int, default=128,
                            help="the largest request message accepted; a larger one drops its connection")

    network = run.add_argument_group("network")
    network.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 opens the ports to all")
    network.add_argument("--port", type=int, default=5555, help="port for requests")
    network.add_argument("--port-out", type=int, default=5556, help="port for results")
    network.add_argument("--server-key", default=None,
                         help="the server's .key_secret file (from `encoder-server keygen`): CURVE-encrypt "
                              "both ports")
    network.add_argument("--authorized-clients", default=None,
                         help="folder of client .key files; with it, only those clients may connect")
    network.add_argument("--worker-port", type=int, default=None,
                         help="accept workers from other hosts (`encoder-server worker`): jobs on this port, "
                              "results on the next one")
    network.add_argument("--http-port", type=int, default=None, help="also serve the HTTP gateway on this port")
    network.add_argument("--http-host", default=None, help="address for the HTTP gateway (default: --host)")
    network.add_argument("--api-key", default=None, help="bearer key that HTTP embedding requests must carry")
    model.add_argument("--model-name", default=None,
                       help="the model's id for HTTP clients (default: all-MiniLM-L6-v2 for the bundled "
                            "model, else the folder's name)")
    run.add_argument("--verbose", action="store_true", help="debug logging")

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
    _add_server_address(gateway, 60.0, "seconds the gateway waits on the server for any one request (504 after)")
    gateway.add_argument("--http-host", default="127.0.0.1", help="address to listen on")
    gateway.add_argument("--http-port", type=int, default=8080, help="port to listen on")
    gateway.add_argument("--api-key", default=None, help="bearer key that embedding requests must carry")
    gateway.add_argument("--verbose", action="store_true", help="debug logging")

    workers = commands.add_parser("worker", help="run workers on this host for a running server (started with "
                                  "--worker-port)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    workers.set_defaults(run=worker)
    workers.add_argument("--connect", required=True, help="the server's address")
    _add_server_address(workers, 30.0)
    workers.add_argument("--model", dest="model_dir", default=None,
                         help="this host's copy of the served model (default: the bundled all-MiniLM-L6-v2)")
    workers.add_argument("--num-worker", type=int, default=None, help="worker processes (default: one per core)")
    workers.add_argument("--threads-per-worker", type=int, default=None, help="intra-op threads per worker lane")
    workers.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where these workers run")
    workers.add_argument("--backend", choices=("onnx", "torch"), default=None,
                         help="inference engine (default: the server's, or torch on cuda)")
    workers.add_argument("--verbose", action="store_true", help="debug logging")

    keys = commands.add_parser("keygen", help="write a CURVE key pair (NAME.key and NAME.key_secret)",
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    keys.set_defaults(run=keygen)
    keys.add_argument("directory", help="folder to write the keys to")
    keys.add_argument("--name", default="server", help="file name of the pair")
    return parser


def _add_server_address(command, timeout, timeout_help="seconds to wait for the server"):
    command.add_argument("--port", type=int, default=5555, help="server's request port")
    command.add_argument("--port-out", type=int, default=5556, help="server's result port")
    command.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
    command.add_argument("--server-key", default=None, help="the server's public .key file, when it uses CURVE")
    command.add_argument("--client-key", default=None, help="this client's .key_secret file, when it uses CURVE")


if __name__ == "__main__":
    sys.exit(main())
