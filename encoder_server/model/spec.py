"""The model's own choices (which model, how it pools, how long its texts are, which engine runs it
on which device in what precision), their bounds, and their resolution against the model folder.

Each choice is declared once, with its default, its help text and its bounds; the service's
Settings (encoder_server.settings) adds its own choices beside these, the CLI builds its options
from both, and `resolve_spec` fills in every choice left at None from what the model folder says.
"""
import argparse
import functools
import importlib.util
import os
from dataclasses import dataclass, field, fields, replace

from .backends import BACKENDS, default_backend
from .cpus import usable_cpus
from .model_files import check_model_files
from .model_folder import ConfigError, default_model_path, inspect_model_folder
from .pooling import MASKABLE, STRATEGIES, PoolingSpec

MODEL, COMPUTE, SCHEDULING = "model and pooling", "compute", "scheduling"
DEVICES = ("cpu", "cuda")
# the kinds of model served: texts -> vectors, (query, text) pairs -> scores, texts -> sparse vocabulary weights
EMBED, RERANK, SPARSE = "embed", "rerank", "sparse"
DEFAULT_BATCH_TOKENS = {"cpu": 1024, "cuda": 16384}  # chosen by measurement: benchmark/RESULTS.md
BUNDLED_MODEL_NAME = "all-MiniLM-L6-v2"
LONG_TEXTS = ("truncate", "error", "chunk")  # what happens to a text longer than max_seq_len


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
class ModelSpec:
    model: str = choice(None, MODEL, "a model folder (Hugging Face or sentence-transformers), or a Hugging Face "
                                     "id ORG/NAME, taken from the Hugging Face cache and downloaded when the "
                                     "network allows (default: the bundled all-MiniLM-L6-v2)")
    revision: str = choice(None, MODEL, "branch, tag or commit of a Hugging Face id (default: main)")
    kind: str = choice(None, MODEL, "embed: texts to vectors; rerank: a cross-encoder's score for each (query, "
                                    "document) pair; sparse: a SPLADE model's weight for each vocabulary token "
                                    "(default: sparse for a sentence-transformers SparseEncoder, rerank for a "
                                    "sequence-classification model with one label, such as a sentence-transformers "
                                    "CrossEncoder, else embed)",
                       choices=(EMBED, RERANK, SPARSE))
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
    long_texts: str = choice("truncate", MODEL, "what happens to a text longer than max_seq_len, unless a request "
                                                "says: truncate (keep its first tokens), error (refuse the request) "
                                                "or chunk (embed it whole: the token-weighted mean of its windows)",
                             choices=LONG_TEXTS)
    chunk_overlap: int = choice(32, MODEL, "tokens that one window of a chunked text shares with the next",
                                minimum=0)
    default_prompt_name: str = choice(None, MODEL, "the prompt of the model's `prompts` applied when a request "
                                                   "names none (default: the model's default_prompt_name)")

    backend: str = choice(None, COMPUTE, "inference engine (default: onnx on cpu, torch on cuda)",
                          choices=tuple(BACKENDS))
    device: str = choice("cpu", COMPUTE, "where workers run the model", choices=DEVICES)
    fp16: bool = choice(False, COMPUTE, "half precision (CUDA only)")
    cuda_graphs: bool = choice(None, COMPUTE, "run each forward pass as a CUDA graph captured for its padded shape: "
                                              "one launch in place of hundreds (default: on for torch on cuda)")
    quantize: str = choice(None, COMPUTE, "dynamic int8 weights (onnx on cpu), served only if it passes the "
                                          "accuracy check", choices=("int8",))
    min_quant_cosine: float = choice(0.99, COMPUTE, "refuse int8 when its mean row cosine against fp32 on a "
                                                    "built-in sample is lower (a reranker's: its mean rank "
                                                    "correlation)")
    threads_per_worker: int = choice(None, COMPUTE, "intra-op threads per lane (default: usable CPUs / (workers x "
                                                    "lanes), so none are oversubscribed)", minimum=1)

    max_batch_size: int = choice(64, SCHEDULING, "larger requests are split into jobs of at most this many texts; "
                                                 "also the row cap of one forward pass", minimum=1)
    max_batch_tokens: int = choice(None, SCHEDULING, "cap on padded tokens (texts x longest) in one forward pass "
                                                     "(default: 1024 on cpu, 16384 on cuda)", minimum=1)

    # derived by resolve_spec() from the model folder, and by prepare.prepare_model
    served_name: str = None   # the Hugging Face id, the folder's name or all-MiniLM-L6-v2
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
    score_activation: str = None  # rerank: the torch.nn class applied to the score (model_folder.ModelInfo)
    splade_pooling: str = None    # sparse: SpladePooling's "max" or "sum" over tokens (model_folder.ModelInfo)
    splade_activation: str = None  # sparse: "relu" or "log1p_relu" before it
    vocab_size: int = None        # sparse: the width of a row
    max_active_dims: int = None   # sparse: the model's default cap on a row's non-zero entries (None: no cap)

    @functools.cached_property  # (read for every request: made once)
    def pooling(self):
        return PoolingSpec(self.pooling_strategy, self.pooling_layer, self.mask_cls_sep, self.normalize)

    @property
    def pools_one_vector(self):
        """Whether each text becomes one dense vector: what windows of long texts merge into, and what
        `dimensions` and precisions apply to."""
        return self.kind == EMBED and not self.pooling.token_level

    @functools.cached_property
    def embedding_dim(self):
        """Floats per row of a result: one score for a reranker, the vocabulary's size for a sparse model."""
        if self.kind == RERANK:
            return 1
        if self.kind == SPARSE:
            return self.vocab_size
        return self.head[-1].out_features if self.head else self.pooling.output_width(self.hidden_size)


FROM_SENTENCE_TRANSFORMERS = "sentence-transformers config"
BERT_AS_SERVICE_DEFAULTS = "bert-as-service defaults"  # a folder without one: mean over layer -2, as bert-as-service
# what sentence-transformers does with such a folder: mean over the last layer, nothing after it
PLAIN_FOLDER_POOLING = PoolingSpec("mean", (-1,))


def choices_of(spec_class):
    """The fields of a ModelSpec (or Settings) class that the user chooses."""
    return tuple(f for f in fields(spec_class) if "help" in f.metadata)


def resolve_spec(chosen):
    """`chosen` (a ModelSpec, or a Settings built on one) with every model choice left at None
    taken from the model folder. ConfigError, one line, for a choice that cannot work."""
    check_bounds(chosen)
    folder, served_name = locate_model(chosen.model, chosen.revision)
    info = inspect_model_folder(folder)
    check_model_files(info.path, info.transformer_path)
    from_st = info.sentence_transformers
    if from_st and info.st_pooling is None and chosen.pooling_strategy is None:
        raise ConfigError(f"--model {info.path}: its pooling ({' + '.join(info.st_pooling_modes) or 'no mode'}) "
                          "has no equivalent here; choose one with --pooling-strategy")
    device, backend = chosen.device, chosen.backend or default_backend(chosen.device)
    spec = replace(
        chosen, model=str(info.path), encoder_path=str(info.transformer_path), served_name=served_name,
        pooling_strategy=chosen.pooling_strategy or (info.st_pooling if from_st else "mean"),
        pooling_layer=tuple(chosen.pooling_layer or ([-1] if from_st else [-2])),
        normalize=info.st_normalize if chosen.normalize is None else chosen.normalize,
        pooling_source=FROM_SENTENCE_TRANSFORMERS if from_st else BERT_AS_SERVICE_DEFAULTS,
        include_prompt=info.st_include_prompt, prompts={**info.prompts, **(chosen.prompts or {})},
        default_prompt_name=unless_chosen(chosen.default_prompt_name, info.default_prompt_name),
        # a CrossEncoder or SparseEncoder folder has no Pooling, but sentence-transformers reads its max_seq_length too
        max_seq_len=_resolve_max_seq_len(chosen.max_seq_len, info, from_st or info.classifier_labels is not None
                                         or info.splade_pooling is not None),
        num_layers=info.num_layers, hidden_size=info.hidden_size,
        backend=backend, cuda_graphs=unless_chosen(chosen.cuda_graphs, device == "cuda" and backend == "torch"),
        threads_per_worker=unless_chosen(chosen.threads_per_worker, 1 if device == "cuda" else usable_cpus()),
        max_batch_tokens=unless_chosen(chosen.max_batch_tokens, DEFAULT_BATCH_TOKENS[device]),
        **_kind_of(chosen, info))
    spec = replace(spec, truncate_at=spec.max_seq_len or info.max_positions)
    spec = replace(spec, **_head_and_overrides(spec, info))
    _check_pooling(spec.pooling, info.num_layers)
    _check_long_texts(spec)
    _check_prompt_name(spec)
    _check_engine(spec)
    return spec


def _kind_of(chosen, info):
    """The kind served and, for a reranker, its score activation (for a sparse model, _sparse_kind's);
    ConfigError for a model that cannot rerank (no classification head, or one of several labels) or an
    activation we do not apply."""
    kind = chosen.kind or (SPARSE if info.splade_pooling else RERANK if info.classifier_labels == 1 else EMBED)
    if kind == SPARSE or info.splade_pooling:
        return _sparse_kind(chosen, info, kind)
    if kind == EMBED:
        return {"kind": kind}
    if info.classifier_labels is None:
        raise ConfigError(f"--kind rerank: {info.path} has no sequence-classification head (a cross-encoder's)")
    if info.classifier_labels != 1:
        raise ConfigError(f"--kind rerank: {info.path} has {info.classifier_labels} labels; a reranker gives one "
                          "score per pair")
    if info.score_activation not in SCORE_ACTIVATIONS:
        raise ConfigError(f"--model {info.path}: its score activation {info.score_activation} is not one of "
                          f"{', '.join(SCORE_ACTIVATIONS)}")
    if chosen.pooling_strategy or chosen.pooling_layer or chosen.normalize or chosen.mask_cls_sep:
        raise ConfigError("a reranker gives scores, not pooled vectors: drop the pooling choices")
    return {"kind": kind, "score_activation": info.score_activation}


def _sparse_kind(chosen, info, kind):
    """A SparseEncoder's SPLADE settings; ConfigError for another kind of model, another kind for a
    SparseEncoder, or a choice that a sparse model does not take."""
    if info.splade_pooling is None:
        raise ConfigError(f"--kind sparse: {info.path} has no SpladePooling module (a sentence-transformers "
                          "SparseEncoder's)")
    if kind != SPARSE:
        raise ConfigError(f"--kind {kind}: {info.path} is a sentence-transformers SparseEncoder; serve it as "
                          "--kind sparse")
    if chosen.pooling_strategy or chosen.pooling_layer or chosen.normalize or chosen.mask_cls_sep:
        raise ConfigError("a sparse model pools as its SpladePooling says: drop the pooling choices")
    if chosen.quantize:
        raise ConfigError(f"--quantize {chosen.quantize}: not available for a sparse model (its accuracy check "
                          "compares dense rows)")
    return {"kind": kind, "splade_pooling": info.splade_pooling, "splade_activation": info.splade_activation,
            "vocab_size": info.vocab_size, "max_active_dims": info.max_active_dims}


# the activations a sentence-transformers CrossEncoder may declare for one label, applied by rerank_scores
SCORE_ACTIVATIONS = ("torch.nn.modules.activation.Sigmoid", "torch.nn.modules.linear.Identity",
                     "torch.nn.modules.activation.Tanh")


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


def _head_and_overrides(spec, info):
    """The head the served model runs, and a line for each way the user's choices change what the
    model folder would compute by itself (the start-up log shows them)."""
    if not info.sentence_transformers:
        return {"head": (), "overrides": ()}
    own = PoolingSpec(info.st_pooling or " + ".join(info.st_pooling_modes), (-1,), False, info.st_normalize)
    pooling, overrides = spec.pooling, []
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


def _check_prompt_name(spec):
    name = spec.default_prompt_name
    if name is not None and name not in spec.prompts:
        known = ", ".join(spec.prompts) or "none"
        raise ConfigError(f"--default-prompt-name {name}: the model has no such prompt (it has: {known})")


def _check_long_texts(spec):
    if spec.long_texts == "chunk" and spec.kind == EMBED and not spec.pools_one_vector:
        raise ConfigError("--long-texts chunk needs one vector per text: token-level pooling has one per token")
    if spec.long_texts == "chunk" and spec.chunk_overlap >= spec.truncate_at - 2:
        raise ConfigError(f"--chunk-overlap {spec.chunk_overlap} leaves no room in a window of {spec.truncate_at} "
                          "tokens (max_seq_len, [CLS] and [SEP] included): use less")


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


def check_bounds(chosen):
    """Each of `chosen`'s choices against its declared bounds."""
    for choice_field in choices_of(type(chosen)):
        value, bounds, flag = getattr(chosen, choice_field.name), choice_field.metadata, flag_of(choice_field.name)
        if value is None:
            continue
        if "choices" in bounds and value not in bounds["choices"]:
            raise ConfigError(f"{flag} {value}: choose one of {', '.join(bounds['choices'])}")
        if bounds.get("minimum") is not None and value < bounds["minimum"]:
            limit = "must not be negative" if bounds["minimum"] == 0 else f"must be at least {bounds['minimum']}"
            raise ConfigError(f"{flag} {limit}, got {value}")
        if bounds.get("port") and not 0 < value < 65535:
            raise ConfigError(f"{flag} {value} is not a usable port")
    if not 0 < chosen.min_quant_cosine <= 1:
        raise ConfigError(f"--min-quant-cosine must be in (0, 1], got {chosen.min_quant_cosine}")


def _check_engine(spec):
    device, backend = spec.device, spec.backend
    if spec.fp16 and device != "cuda":
        raise ConfigError("--fp16 needs --device cuda")
    if spec.cuda_graphs and (device != "cuda" or backend != "torch"):
        raise ConfigError("--cuda-graphs needs --device cuda and --backend torch")
    if spec.quantize and (backend != "onnx" or device != "cpu"):
        raise ConfigError("--quantize int8 needs --backend onnx on --device cpu")
    if backend == "torch" and importlib.util.find_spec("torch") is None:
        raise ConfigError("--backend torch needs torch, which this install lacks (pip install "
                          "'encoder-server[server]', or the container image's full target)")
    if device == "cuda" and backend == "torch":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible to torch")
    if device == "cuda" and backend == "onnx":
        import onnxruntime
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise ConfigError("--device cuda --backend onnx needs the onnxruntime-gpu package")


def unless_chosen(value, default):
    return default if value is None else value


def flag_of(name):
    return "--" + name.replace("_", "-")
