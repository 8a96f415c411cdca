"""`encoder-server worker`: workers on another host that join a running server.

The server's SHOW_CONFIG says where its worker ports are and how it pools, so these workers
compute exactly what the server's own do, from this host's copy of the model. They take jobs
from the server's queues and send results to its sink; the ventilator treats them like its own
(heartbeats, re-dispatch when one dies). Here they are kept running by a WorkerPool.
"""
import multiprocessing
import signal
import threading
from multiprocessing.connection import wait

from encoder_client import EncoderClient
from encoder_client.keys import curve_keys

from ..logs import configure_logging
from ..model.model_folder import ConfigError
from ..model.prepare import prepare_model_apart
from ..processes import reap_resource_tracker
from ..settings import resolve
from .sockets import remote_worker_endpoints
from .worker_pool import MAX_FAILED_STARTS, WorkerPool

WATCH_INTERVAL = 0.5
# the server's choices that decide what a worker computes and how it batches (a reranker has no pooling)
_POOLING = ("pooling_strategy", "pooling_layer", "mask_cls_sep", "normalize")
_COPIED = _POOLING + ("kind", "max_seq_len", "max_batch_size", "priority_batch_size", "batch_wait_ms",
                      "min_quant_cosine")


def join_server(args):
    log = configure_logging("remote", args.verbose)
    config = _server_config(args)
    settings = worker_settings(config, args)
    settings = prepare_model_apart(settings, verbose=settings.verbose)
    endpoints = remote_worker_endpoints(args.connect, config["worker_port"],
                                        curve_keys(args.server_key, args.client_key) if config.get("curve") else None)
    log.info("joining %s: jobs on %s, results to %s; %d worker(s) of %d lane(s), %d thread(s) each, %d tokenizing",
             args.connect, endpoints.jobs, endpoints.results, settings.num_worker, settings.lanes,
             settings.threads_per_worker, settings.tokenizer_threads)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    # spawned, not forked as the supervisor's are: asking the server for its config left this process
    # a zmq context, whose I/O threads do not survive a fork (a child would get its locks, not them)
    pool = WorkerPool(multiprocessing.get_context("spawn"), [settings], endpoints, remote=True)
    try:
        while not stop.is_set():
            wait(pool.sentinels, timeout=WATCH_INTERVAL)
            pool.restart_exited()
            start_error = pool.cannot_start()
            if start_error is not None:
                log.error("workers cannot start (each failed %d times in a row); stopping: %s", MAX_FAILED_STARTS,
                          start_error)
                return 1
    finally:
        pool.stop()
        reap_resource_tracker()
    log.info("stopped")
    return 0


def worker_settings(config, args):
    """Settings for workers that compute what the server described in `config` computes."""
    if not config.get("worker_port"):
        raise ConfigError(f"the server at {args.connect}:{args.port} does not accept workers from other hosts; "
                          "start it with --worker-port")
    if config.get("curve") and not (args.server_key and args.client_key):
        raise ConfigError("the server uses CURVE: pass --server-key (its public .key) and --client-key "
                          "(this host's .key_secret, listed in its --authorized-clients)")
    same_device = args.device == config["device"]
    settings = resolve(model=args.model, device=args.device,
                       backend=args.backend or (config["backend"] if same_device else None),
                       quantize=config["quantize"] if same_device else None,
                       max_batch_tokens=config["max_batch_tokens"] if same_device else None,
                       num_worker=args.num_worker, lanes=args.lanes, threads_per_worker=args.threads_per_worker,
                       tokenizer_threads=args.tokenizer_threads,
                       cuda_graphs=args.cuda_graphs,
                       verbose=args.verbose, names=[config["model_name"]],  # serve the server's default model
                       **{name: config[name] for name in _COPIED
                          if not (config["kind"] == "rerank" and name in _POOLING)})
    if settings.num_layers != config["num_layers"]:
        raise ConfigError(f"the server's model has {config['num_layers']} layers, this host's "
                          f"{settings.num_layers}: pass --model with a copy of the served model")
    return settings


def _server_config(args):
    with EncoderClient(args.connect, args.port, args.port_out, timeout=args.timeout, server_key=args.server_key,
                       client_key=args.client_key) as client:
        return client.server_config
