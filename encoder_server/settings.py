"""The settings every process uses: the user's choices plus what the model folder says.

Each choice is declared once, below, with its default, its help text and its bounds; the CLI
builds `encoder-server start`'s options from these declarations, `resolve` checks them, and
SHOW_CONFIG reports them under the same names. Pooling names come from backends.pooling and
backend names from backends.BACKENDS.
"""
import argparse
import os
from dataclasses import asdict, dataclass, field, fields, replace

from .backends import BACKENDS, default_backend
from .backends.pooling import MASKABLE, STRATEGIES, PoolingSpec
from .cpus import default_workers, usable_cpus
from .intake import is_loopback
from .model_folder import ConfigError, default_model_path, inspect_model_folder

MODEL, COMPUTE, SCHEDULING, NETWORK = "model and pooling", "compute", "scheduling", "network"
DEVICES = ("cpu", "cuda")
DEFAULT_BATCH_TOKENS = {"cpu": 1024, "cuda": 16384}  # chosen by measurement: benchmark/RESULTS.md
BUNDLED_MODEL_NAME = "all-MiniLM-L6-v2"
GATEWAY_TIMEOUT = 60.0  # seconds the HTTP gateway waits on the server for any one request (504 after)
_PRIVATE = ("host", "onnx_file", "server_key", "authorized_clients", "api_key", "http_host", "encoder_path")
# the names OpenAI clients send when none is configured (LangChain's and LlamaIndex's default)
CLIENT_DEFAULT_NAMES = ("text-embedding-ada-002",)


def choice(default, group, help, **bounds):
    """A setting the user chooses (`encoder-server start --NAME`). `bounds`: `choices`, `minimum`,
    `port=True`, or for the CLI `nargs` and `parse` (the type of one value)."""
    return field(default=default, metadata={"group": group, "help": help, **bounds})


def parse_max_seq_len(value):
    if value.lower() in ("none", "auto"):
        return None if value.lower() == "none" else "auto"
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither an integer nor 'none'") from None


@dataclass(frozen=True)
class Settings:
    model: str = choice(None, MODEL, "a model folder (Hugging Face or sentence-transformers), or a Hugging Face "
                                     "id ORG/NAME, taken from the Hugging Face cache and downloaded when the "
                                     "network allows (default: the bundled all-MiniLM-L6-v2)")
    revision: str = choice(None, MODEL, "branch, tag or commit of a Hugging Face id (default: main)")
    model_name: tuple = choice(None, MODEL, "another name HTTP clients may call the model by; may be given several "
                                            "times (the served name is the Hugging Face id, the folder's name or "
                                            "all-MiniLM-L6-v2)", action="append")
    pooling_strategy: str = choice(None, MODEL, "how token vectors become one vector (default: the model "
                                                "folder's sentence-transformers pooling, else mean)",
                                   choices=STRATEGIES)
    pooling_layer: tuple = choice(None, MODEL, "hidden layer(s) to pool, negative from the top, 0 = embeddings; "
                                               "several are concatenated (default: -1 for sentence-transformers "
                                               "folders, else -2)", nargs="+", parse=int)
    mask_cls_sep: bool = choice(False, MODEL, "leave [CLS] and [SEP] out of the pooling")
    normalize: bool = choice(None, MODEL, "L2-normalise each embedding (default: as the model folder's "
                                          "Normalize module says)")
    max_seq_len: int = choice("auto", MODEL, "tokens kept per text, or 'none' for the model's limit with padding "
                                             "to the longest text of each batch; 'auto' takes sentence-transformers' "
                                             "max_seq_length, else the model's limit", parse=parse_max_seq_len)
    default_prompt_name: str = choice(None, MODEL, "the prompt of the model's `prompts` applied when a request "
                                                   "names none (default: the model's default_prompt_name)")
    show_tokens_to_client: bool = choice(False, MODEL, "allow clients to ask for their WordPiece tokens")

    backend: str = choice(None, COMPUTE, "inference engine (default: onnx on cpu, torch on cuda)",
                          choices=tuple(BACKENDS))
    device: str = choice("cpu", COMPUTE, "where workers run the model", choices=DEVICES)
    fp16: bool = choice(False, COMPUTE, "half precision (CUDA only)")
    quantize: str = choice(None, COMPUTE, "dynamic int8 weights (onnx on cpu), served only if it passes the "
                                          "accuracy check", choices=("int8",))
    min_quant_cosine: float = choice(0.99, COMPUTE, "refuse int8 when its mean row cosine against fp32 on a "
                                                    "built-in sample is lower")
    num_worker: int = choice(None, COMPUTE, "worker processes (default: one per usable CPU, within the cgroup's "
                                            "CPU quota, up to 8; 1 on cuda)", minimum=1)
    threads_per_worker: int = choice(None, COMPUTE, "intra-op threads per worker lane (default: usable CPUs / workers, "
                                                    "so none are oversubscribed)", minimum=1)

    priority_batch_size: int = choice(16, SCHEDULING, "requests of at most this many texts go to the "
                                                      "high-priority queue, spread over the idle workers", minimum=1)
    max_batch_size: int = choice(64, SCHEDULING, "larger requests are split into jobs of at most this many texts; "
                                                 "also the row cap of one forward pass", minimum=1)
    max_batch_tokens: int = choice(None, SCHEDULING, "cap on padded tokens (texts x longest) in one forward pass "
                                                     "(default: 1024 on cpu, 16384 on cuda)", minimum=1)
    batch_wait_ms: float = choice(0.0, SCHEDULING, "how long small requests may wait for others to share their "
                                                   "forward pass", minimum=0)
    prefetch_size: int = choice(2, SCHEDULING, "bulk jobs a worker receives and tokenizes ahead of the model",
                                minimum=1)
    drain_timeout: float = choice(10.0, SCHEDULING, "seconds that in-flight requests get to finish on stop "
                                                    "(below docker stop's 10 s grace with the rest of the stop)",
                                  minimum=0)
    max_pending_texts: int = choice(100_000, SCHEDULING, "texts of unfinished requests the server holds; a "
                                                         "request past it gets an immediate 'server busy' error",
                                    minimum=1)
    max_request_mb: int = choice(128, SCHEDULING, "the largest request message accepted; a larger one drops its "
                                                  "connection", minimum=1)
    max_result_mb: int = choice(512, SCHEDULING, "the largest result a request may ask for, counted at its "
                                                 "longest (every text at --max-seq-len under token-level "
                                                 "pooling); a larger request is refused at once", minimum=1)
    max_unread_mb: int = choice(None, SCHEDULING, "results the server keeps for one client identity that has not "
                                                  "read them yet; past it, that client's further results are "
                                                  "dropped with an error and its queued requests abandoned "
                                                  "(default: 2 x --max-result-mb)", minimum=1)

    host: str = choice("127.0.0.1", NETWORK, "address to bind; 0.0.0.0 opens the ports to all")
    port: int = choice(5555, NETWORK, "port for requests")
    port_out: int = choice(5556, NETWORK, "port for results")
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

    # derived by resolve() from the model folder, and by backends.prepare_model
    encoder_path: str = None  # the folder of the encoder's weights and tokenizer
    pooling_source: str = None
    include_prompt: bool = True  # whether prompt tokens count in pooling
    head: tuple = ()          # model_folder.HeadLayer modules run after pooling
    prompts: dict = None      # prompt name -> text
    overrides: tuple = ()     # where the user's choices depart from the model's own configuration
    truncate_at: int = None   # tokens kept per text
    num_layers: int = None
    hidden_size: int = None
    onnx_file: str = None

    @property
    def pooling(self):
        return PoolingSpec(self.pooling_strategy, self.pooling_layer, self.mask_cls_sep, self.normalize)

    @property
    def embedding_dim(self):
        return self.head[-1].out_features if self.head else self.pooling.output_width(self.hidden_size)

    def listening(self):
        """(host, port) of every port this server listens on."""
        ports = [(self.host, self.port), (self.host, self.port_out)]
        if self.worker_port:
            ports += [(self.host, self.worker_port), (self.host, self.worker_port + 1)]
        for port in (self.http_port, self.metrics_port):
            if port:
                ports.append((self.http_host or self.host, port))
        return ports

    def public_config(self):
        """What SHOW_CONFIG reveals: no file-system paths, no keys, no internal addresses."""
        config = {name: value for name, value in asdict(self).items() if name not in _PRIVATE}
        config.update(model=os.path.basename(os.path.normpath(self.model)), pooling_layer=list(self.pooling_layer),
                      model_name=self.model_name[0], model_names=list(self.model_name),
                      head=[layer.describe() for layer in self.head], overrides=list(self.overrides),
                      embedding_dim=self.embedding_dim, curve=self.server_key is not None,
                      clients_authenticated=self.authorized_clients is not None)
        return config


CHOICES = tuple(f for f in fields(Settings) if "help" in f.metadata)


HTTP_LIMITS = ("http_keep_alive", "http_header_timeout", "http_body_timeout", "http_max_connections")


def http_limits(values):
    """The gateway's connection limits, by name, from `values` (Settings or the `http` command's
    arguments), checked against their declared bounds (ConfigError)."""
    limits = {name: getattr(values, name) for name in HTTP_LIMITS}
    _check_bounds(Settings(**limits))
    return limits


def resolve(**choices):
    """Settings from the user's choices (Settings' fields, by name); every choice left at None
    takes the model folder's default. ConfigError, one line, for a choice that cannot work."""
    chosen = Settings(**choices)
    _check_bounds(chosen)
    folder, served_name = locate_model(chosen.model, chosen.revision)
    info = inspect_model_folder(folder)
    from_st = info.sentence_transformers
    if from_st and info.st_pooling is None and chosen.pooling_strategy is None:
        raise ConfigError(f"--model {info.path}: its pooling ({' + '.join(info.st_pooling_modes) or 'no mode'}) "
                          "has no equivalent here; choose one with --pooling-strategy")
    device = chosen.device
    num_worker = _unless_chosen(chosen.num_worker, default_workers(usable_cpus()) if device == "cpu" else 1)
    settings = replace(
        chosen, model=str(info.path), encoder_path=str(info.transformer_path),
        model_name=tuple(dict.fromkeys((served_name, *(chosen.model_name or ()), *CLIENT_DEFAULT_NAMES))),
        pooling_strategy=chosen.pooling_strategy or (info.st_pooling if from_st else "mean"),
        pooling_layer=tuple(chosen.pooling_layer or ([-1] if from_st else [-2])),
        normalize=info.st_normalize if chosen.normalize is None else chosen.normalize,
        pooling_source="sentence-transformers config" if from_st else "bert-as-service defaults",
        include_prompt=info.st_include_prompt, prompts=dict(info.prompts),
        default_prompt_name=_unless_chosen(chosen.default_prompt_name, info.default_prompt_name),
        max_seq_len=_resolve_max_seq_len(chosen.max_seq_len, info, from_st),
        num_layers=info.num_layers, hidden_size=info.hidden_size,
        backend=chosen.backend or default_backend(device), num_worker=num_worker,
        threads_per_worker=_unless_chosen(chosen.threads_per_worker, _default_threads(num_worker, device)),
        max_batch_tokens=_unless_chosen(chosen.max_batch_tokens, DEFAULT_BATCH_TOKENS[device]),
        max_unread_mb=_unless_chosen(chosen.max_unread_mb, 2 * chosen.max_result_mb))
    settings = replace(settings, truncate_at=settings.max_seq_len or info.max_positions)
    settings = replace(settings, **_head_and_overrides(settings, info))
    _check_pooling(settings.pooling, info.num_layers)
    _check_prompt_name(settings)
    _check_engine(settings)
    _check_keys(settings.server_key, settings.authorized_clients)
    _check_worker_port(settings)
    return settings


def locate_model(model, revision=None):
    """(folder, served name) of `--model`: the bundled model, a folder, or a Hugging Face id."""
    if model is None:
        if revision:
            raise ConfigError("--revision needs --model with a Hugging Face id")
        return default_model_path(), BUNDLED_MODEL_NAME
    if os.path.isdir(model) or model.startswith(("/", ".", "~")) or model.count("/") > 1:
        if not os.path.isdir(model):
            raise ConfigError(f"--model {model}: no such folder")
        if revision:
            raise ConfigError(f"--revision {revision}: --model {model} is a folder, not a Hugging Face id")
        return model, _name_of_folder(model)
    from .hub import download_model
    return download_model(model, revision), model


def _name_of_folder(folder):
    """A folder's served name: ORG/NAME for a snapshot in the Hugging Face cache, else its name."""
    parts = os.path.normpath(os.path.abspath(folder)).split(os.sep)
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/")
    return parts[-1]


def _head_and_overrides(settings, info):
    """The head the served model runs, and a line for each way the user's choices change what the
    model folder would compute by itself (the start-up log shows them)."""
    if not info.sentence_transformers:
        return {"head": (), "overrides": ()}
    own = PoolingSpec(info.st_pooling or " + ".join(info.st_pooling_modes), (-1,), False, info.st_normalize)
    pooling, overrides = settings.pooling, []
    for name, mine, theirs in (("--pooling-strategy", pooling.strategy, own.strategy),
                               ("--pooling-layer", pooling.layers, own.layers),
                               ("--mask-cls-sep", pooling.mask_cls_sep, own.mask_cls_sep),
                               ("--normalize", pooling.normalize, own.normalize)):
        if mine != theirs:
            overrides.append(f"{name} {_shown(mine)} replaces the model's own {_shown(theirs)}")
    head = info.head
    width = pooling.output_width(info.hidden_size)
    if head and not overrides and head[0].in_features != width:
        raise ConfigError(f"--model {info.path}: its {head[0].describe()} takes {head[0].in_features} features, "
                          f"but its pooling gives {width}")
    if head and (pooling.token_level or head[0].in_features != width):
        overrides.append(f"the model's {' + '.join(layer.describe() for layer in head)} after pooling is dropped: "
                         f"it takes {head[0].in_features} features and this pooling gives {width}, so rows are "
                         f"{width} wide, not {head[-1].out_features}")
        head = ()
    return {"head": head, "overrides": tuple(overrides)}


def _shown(value):
    return ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _check_prompt_name(settings):
    name = settings.default_prompt_name
    if name is not None and name not in settings.prompts:
        known = ", ".join(settings.prompts) or "none"
        raise ConfigError(f"--default-prompt-name {name}: the model has no such prompt (it has: {known})")


def _check_pooling(pooling, num_layers):
    if pooling.mask_cls_sep and pooling.strategy not in MASKABLE:
        raise ConfigError(f"--mask-cls-sep has no meaning with --pooling-strategy {pooling.strategy}")
    for layer in pooling.layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise ConfigError(f"--pooling-layer {layer}: the model has {num_layers} layers, so use "
                              f"{-(num_layers + 1)}..{num_layers} (0 is the embedding output)")


def _resolve_max_seq_len(value, info, from_st):
    if value == "auto":
        value = info.st_max_seq_len if from_st and info.st_max_seq_len else info.max_positions
    if value is None:
        return None
    if value < 3:
        raise ConfigError(f"--max-seq-len {value}: must be at least 3 ([CLS] + one token + [SEP])")
    if value > info.max_positions:
        raise ConfigError(f"--max-seq-len {value} is above the model's limit of {info.max_positions} tokens")
    return value


def _check_bounds(settings):
    """Each choice against its declared bounds, then the rules that tie two choices together."""
    for choice_field in CHOICES:
        value, bounds, flag = getattr(settings, choice_field.name), choice_field.metadata, _flag(choice_field.name)
        if value is None:
            continue
        if "choices" in bounds and value not in bounds["choices"]:
            raise ConfigError(f"{flag} {value}: choose one of {', '.join(bounds['choices'])}")
        if bounds.get("minimum") is not None and value < bounds["minimum"]:
            limit = "must not be negative" if bounds["minimum"] == 0 else f"must be at least {bounds['minimum']}"
            raise ConfigError(f"{flag} {limit}, got {value}")
        if bounds.get("port") and not 0 < value < 65535:
            raise ConfigError(f"{flag} {value} is not a usable port")
    if settings.priority_batch_size > settings.max_batch_size:
        raise ConfigError("--priority-batch-size must not exceed --max-batch-size")
    if not 0 < settings.min_quant_cosine <= 1:
        raise ConfigError(f"--min-quant-cosine must be in (0, 1], got {settings.min_quant_cosine}")
    if settings.max_unread_mb is not None and settings.max_unread_mb < settings.max_result_mb:
        raise ConfigError(f"--max-unread-mb {settings.max_unread_mb} is below --max-result-mb "
                          f"{settings.max_result_mb}: a result that large could never be kept for its client")


def _check_engine(settings):
    device, backend = settings.device, settings.backend
    if settings.fp16 and device != "cuda":
        raise ConfigError("--fp16 needs --device cuda")
    if settings.quantize and (backend != "onnx" or device != "cpu"):
        raise ConfigError("--quantize int8 needs --backend onnx on --device cpu")
    if device == "cuda" and backend == "torch":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible to torch")
    if device == "cuda" and backend == "onnx":
        import onnxruntime
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise ConfigError("--device cuda --backend onnx needs the onnxruntime-gpu package")


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
        from .security import load_key_pair
        try:
            load_key_pair(server_key)
        except (OSError, ValueError) as error:
            raise ConfigError(f"--server-key {server_key}: {error}") from None


def _unless_chosen(value, default):
    return default if value is None else value


def _flag(name):
    return "--" + name.replace("_", "-")


def _default_threads(num_worker, device):
    if device == "cuda":
        return 1
    return max(1, usable_cpus() // num_worker)
