"""The settings every process of the service uses: the model's choices (model.spec.ModelSpec)
plus the service's own (workers, queues, ports, timeouts, security).

Each choice is declared once, with its default, its help text and its bounds; the CLI builds
`encoder-server start`'s options from these declarations, `resolve` checks them, and SHOW_CONFIG
reports them under the same names.
"""
import os
from dataclasses import asdict, dataclass, replace

from encoder_client.protocol import DEFAULT_MAX_REQUEST_MB, DEFAULT_PORT, DEFAULT_PORT_OUT

from .model.backends import default_backend
from .model.cpus import default_cuda_workers, default_workers, usable_cpus
from .model.gpu_memory import cuda_device_bytes, worker_bytes, workers_that_fit
from .model.model_folder import ConfigError
from .model.spec import (COMPUTE, MODEL, SCHEDULING, ModelSpec, check_bounds, choice, choices_of,
                         resolve_spec, unless_chosen)
from .served_models import check_names, model_entries
from .security import is_loopback, load_key_pair
from .server.scheduling import MAX_LANES, MAX_TOKENIZER_THREADS

NETWORK = "network"
_PRIVATE = ("host", "onnx_file", "server_key", "authorized_clients", "api_key", "http_host", "encoder_path",
            "served_name", "served", "models")
# the names OpenAI clients send when none is configured (LangChain's and LlamaIndex's default)
CLIENT_DEFAULT_NAMES = ("text-embedding-ada-002",)


@dataclass(frozen=True)
class Settings(ModelSpec):
    models: str = choice(None, MODEL, "a TOML file of the models to serve, each with its own name(s) and choices "
                                      "(README: Several models); the options given here are every model's "
                                      "defaults. Without it, --model may be given several times")
    model_name: tuple = choice(None, MODEL, "another name clients may call the (default) model by; may be given "
                                            "several times (the served name is the Hugging Face id, the folder's "
                                            "name or all-MiniLM-L6-v2)", action="append")
    show_tokens_to_client: bool = choice(False, MODEL, "allow clients to ask for their WordPiece tokens")

    num_worker: int = choice(None, COMPUTE, "worker processes (default: 1 for onnx on cpu, which runs its passes "
                                            "in lanes; for torch on cpu one per usable CPU, within the cgroup's "
                                            "CPU quota, up to 8; on cuda one per two CPUs, up to 8 and as many "
                                            "as half the GPU's memory holds)", minimum=1)
    lanes: int = choice(None, COMPUTE, "forward passes each worker process runs at once, on threads sharing one "
                                       "copy of the model (default for onnx on cpu: one per usable CPU up to 8, "
                                       "shared out among the workers; else 1)", minimum=1)
    tokenizer_threads: int = choice(None, COMPUTE, "threads each worker process tokenizes its jobs on, ahead of its "
                                                   "lanes (default: 1; on cuda, usable CPUs / (2 x workers), so that "
                                                   "fewer workers each feed the GPU from more cores)", minimum=1)
    pin_cpus: bool = choice(False, COMPUTE, "keep each process of the server on CPUs of its own: the ventilator "
                                            "and the sink on one each, each worker on its share (workers on other "
                                            "hosts are not pinned)")

    priority_batch_size: int = choice(16, SCHEDULING, "requests of at most this many texts go to the "
                                                      "high-priority queue, spread over the idle workers", minimum=1)
    batch_wait_ms: float = choice(0.0, SCHEDULING, "how long small requests may wait for others to share their "
                                                   "forward pass", minimum=0)
    prefetch_size: int = choice(None, SCHEDULING, "bulk jobs a worker holds per lane, the one it runs included "
                                                  "(default, by each worker's device: 2; 3 on cuda and on the zero "
                                                  "backend, whose passes end about as fast as the word of a "
                                                  "finished job reaches the ventilator)", minimum=1)
    drain_timeout: float = choice(10.0, SCHEDULING, "seconds that in-flight requests get to finish on stop "
                                                    "(below docker stop's 10 s grace with the rest of the stop)",
                                  minimum=0)
    max_pending_texts: int = choice(100_000, SCHEDULING, "texts of unfinished requests the server holds; a "
                                                         "request past it gets an immediate 'server busy' error",
                                    minimum=1)
    max_request_mb: int = choice(DEFAULT_MAX_REQUEST_MB, SCHEDULING, "the largest request message accepted; a "
                                                                     "larger one drops its connection", minimum=1)
    max_result_mb: int = choice(512, SCHEDULING, "the largest result a request may ask for, counted at its "
                                                 "longest (every text at --max-seq-len under token-level "
                                                 "pooling); a larger request is refused at once", minimum=1)
    max_unread_mb: int = choice(None, SCHEDULING, "results the server keeps for one client identity that has not "
                                                  "read them yet; past it, that client's further results are "
                                                  "dropped with an error and its queued requests abandoned "
                                                  "(default: 2 x --max-result-mb)", minimum=1)

    host: str = choice("127.0.0.1", NETWORK, "address to bind; 0.0.0.0 opens the ports to all")
    port: int = choice(DEFAULT_PORT, NETWORK, "port for requests")
    port_out: int = choice(DEFAULT_PORT_OUT, NETWORK, "port for results")
    server_key: str = choice(None, NETWORK, "the server's .key_secret file (from `encoder-server keygen`): "
                                            "CURVE-encrypt both ports")
    authorized_clients: str = choice(None, NETWORK, "folder of client .key files; with it, only those clients "
                                                    "may connect")
    worker_port: int = choice(None, NETWORK, "accept workers from other hosts (`encoder-server worker`): jobs on "
                                             "this port, results on the next one", port=True)
    http_port: int = choice(None, NETWORK, "also serve the HTTP gateway on this port", port=True)
    http_host: str = choice(None, NETWORK, "address for the HTTP gateway and --metrics-port (default: --host)")
    metrics_port: int = choice(None, NETWORK, "serve Prometheus metrics on this port (GET /metrics), also "
                                              "without the HTTP gateway", port=True)
    api_key: str = choice(None, NETWORK, "bearer key that HTTP embedding requests must carry")
    http_keep_alive: float = choice(5.0, NETWORK, "seconds the HTTP gateway keeps an idle connection open "
                                                  "between requests", minimum=0)
    http_header_timeout: float = choice(10.0, NETWORK, "seconds a new HTTP connection, or one between requests "
                                                       "once it sends a byte, gets to send a complete request "
                                                       "head; then it is closed", minimum=1)
    http_body_timeout: float = choice(60.0, NETWORK, "seconds an HTTP request body gets to arrive in full; "
                                                     "then 408 and the connection is closed", minimum=1)
    http_max_connections: int = choice(1000, NETWORK, "open HTTP connections served at once; a request on "
                                                       "one more gets 503 and its connection is closed",
                                       minimum=1)
    verbose: bool = choice(False, None, "debug logging")
    log_format: str = choice("text", None, "log lines as text, or as one JSON object each", choices=("text", "json"))

    served: tuple = ()  # every served model's Settings, the default (this one) first; resolve() fills it in

    @property
    def client_host(self):
        """How a process on this host reaches this server."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "*") else self.host

    def listening(self):
        """(host, port) of every port this server listens on."""
        ports = [(self.host, self.port), (self.host, self.port_out)]
        if self.worker_port:
            ports += [(self.host, self.worker_port), (self.host, self.worker_port + 1)]
        for port in (self.http_port, self.metrics_port):
            if port:
                ports.append((self.http_host or self.host, port))
        return ports

    @property
    def all_models(self):
        """Every served model's Settings, the default first (this one alone before resolve() fills in `served`)."""
        return self.served or (self,)

    @property
    def name(self):
        """The model's served name: the first of its names."""
        return self.model_name[0]

    def public_config(self):
        """What SHOW_CONFIG reveals: no file-system paths, no keys, no internal addresses. The top
        level is the default model's; `models` has one entry per served model."""
        config = self._model_config()
        config.update(curve=self.server_key is not None, clients_authenticated=self.authorized_clients is not None,
                      models=[model._model_config() for model in self.all_models])
        return config

    def _model_config(self):
        config = {name: value for name, value in asdict(self, dict_factory=_shallow).items() if name not in _PRIVATE}
        config.update(model=os.path.basename(os.path.normpath(self.model)), pooling_layer=list(self.pooling_layer),
                      model_name=self.name, model_names=list(self.model_name),
                      head=[layer.describe() for layer in self.head], overrides=list(self.overrides),
                      embedding_dim=self.embedding_dim)
        return config


CHOICES = choices_of(Settings)


def _shallow(items):
    return {name: value for name, value in items if name != "served"}


def resolve(**choices):
    """Settings from the user's choices (Settings' fields, by name); every choice left at None
    takes the model folder's default, or the service's. `model` may be a list (several models with
    these choices) and `models` a models file (served_models). The result is the default model's
    Settings, with every model's in `served`. ConfigError, one line, for a choice that cannot work."""
    entries = model_entries(choices.get("model"), choices.get("models"))
    shared = {name: value for name, value in choices.items() if name != "model"}
    others = {name: value for name, value in shared.items() if name != "model_name"}  # --model-name: the default's
    # each model's share of the CPUs and the GPU, so that one's load never slows another
    cpus, gpu_share = max(1, usable_cpus() // len(entries)), 1 / len(entries)
    served = [_resolve_one({**(others if index else shared), **entry}, cpus, gpu_share, default=index == 0)
              for index, entry in enumerate(entries)]
    check_names(served)
    _check_keys(served[0].server_key, served[0].authorized_clients)
    _check_worker_port(served[0])
    return replace(served[0], served=tuple(served))


def _resolve_one(choices, cpus, gpu_share, default):
    names = choices.pop("names", None)
    chosen = Settings(**choices)
    check_bounds(chosen)
    _check_service_bounds(chosen)
    settings = resolve_spec(replace(chosen, **_compute_defaults(chosen, cpus)))
    if settings.device == "cuda" and chosen.num_worker is None:
        settings = replace(settings, num_worker=_cuda_workers_that_fit(settings, gpu_share))
    settings = replace(settings, tokenizer_threads=unless_chosen(chosen.tokenizer_threads,
                                                                 default_tokenizer_threads(settings, cpus)))
    aliases = CLIENT_DEFAULT_NAMES if default and settings.kind == "embed" else ()
    return replace(
        settings, model_name=tuple(dict.fromkeys((*(names or ()), settings.served_name, *(chosen.model_name or ()),
                                                  *aliases))),
        max_unread_mb=unless_chosen(chosen.max_unread_mb, 2 * chosen.max_result_mb))


def _compute_defaults(chosen, cpus):
    """Worker processes, lanes per worker and intra-op threads per lane, on `cpus` cores. ONNX Runtime
    on the CPU runs concurrent passes on one session, so one process holds every lane and one copy of
    the weights; torch's intra-op threads are per process, so it gets a process per CPU instead."""
    cuda = chosen.device == "cuda"
    in_lanes = not cuda and (chosen.backend or default_backend(chosen.device)) == "onnx"
    num_worker = unless_chosen(chosen.num_worker, default_cuda_workers(cpus) if cuda
                               else 1 if in_lanes else default_workers(cpus))
    lanes = unless_chosen(chosen.lanes, max(1, default_workers(cpus) // num_worker) if in_lanes else 1)
    threads = unless_chosen(chosen.threads_per_worker, 1 if cuda else max(1, cpus // (num_worker * lanes)))
    return {"num_worker": num_worker, "lanes": lanes, "threads_per_worker": threads}


def default_tokenizer_threads(settings, cpus):
    """One thread per worker tokenizes on the CPU, where the model is far slower than the tokenizer.
    A GPU runs short texts faster than one thread tokenizes them (an H200 with CUDA graphs, 79,673
    texts/s in fp16; one thread tokenizes about 50,000), so a CUDA worker tokenizes on half its share
    of the host's cores; the other half runs its own Python (intake, planning, its lanes), the
    ventilator and the sink. (Those figures are `tokenizers`', which such a worker keeps; a worker
    with one tokenizing thread takes plain texts of a WordPiece model through Python's faster path,
    which holds the GIL, see model/word_pieces.py.)"""
    return max(1, cpus // (2 * settings.num_worker)) if settings.device == "cuda" else 1


def _cuda_workers_that_fit(settings, gpu_share):
    """The default CUDA workers, fewer where the GPU's memory (this model's share) holds fewer."""
    gpu_bytes = cuda_device_bytes()
    if gpu_bytes is None:
        return settings.num_worker
    return min(settings.num_worker, workers_that_fit(gpu_bytes * gpu_share, worker_bytes(settings)))


def _check_service_bounds(settings):
    """The rules that tie two of the service's choices together."""
    if settings.priority_batch_size > settings.max_batch_size:
        raise ConfigError("--priority-batch-size must not exceed --max-batch-size")
    if settings.lanes is not None and settings.lanes > MAX_LANES:
        raise ConfigError(f"--lanes must be at most {MAX_LANES}")
    if settings.tokenizer_threads is not None and settings.tokenizer_threads > MAX_TOKENIZER_THREADS:
        raise ConfigError(f"--tokenizer-threads must be at most {MAX_TOKENIZER_THREADS}")
    if settings.max_unread_mb is not None and settings.max_unread_mb < settings.max_result_mb:
        raise ConfigError(f"--max-unread-mb {settings.max_unread_mb} is below --max-result-mb "
                          f"{settings.max_result_mb}: a result that large could never be kept for its client")


def _check_worker_port(settings):
    """A worker port reads every client's texts and writes their embeddings: open beyond this host
    only to workers that hold an authorized key."""
    if settings.worker_port and not _loopback_host(settings.host) and not (
            settings.server_key and settings.authorized_clients):
        raise ConfigError(f"--worker-port on {settings.host} would let anyone who reaches it read every client's "
                          "texts and forge their embeddings: add --server-key and --authorized-clients "
                          "(see `encoder-server keygen`), or keep --host on loopback")


def _loopback_host(host):
    return host == "localhost" or is_loopback(host)


def _check_keys(server_key, authorized_clients):
    if authorized_clients and not server_key:
        raise ConfigError("--authorized-clients needs --server-key (make one with `encoder-server keygen`)")
    if authorized_clients and not os.path.isdir(authorized_clients):
        raise ConfigError(f"--authorized-clients {authorized_clients}: not a folder")
    if server_key:
        try:
            load_key_pair(server_key)
        except (OSError, ValueError) as error:
            raise ConfigError(f"--server-key {server_key}: {error}") from None
