"""encoder_server.settings.resolve and encoder_server.model.model_folder, on model folders made of JSON files."""
import json
import re

import pytest

from encoder_server.model.model_folder import ConfigError, inspect_model_folder
from encoder_server.model.backends import BACKENDS
from encoder_server.model.pooling import STRATEGIES, PoolingSpec
from encoder_server.settings import CHOICES, resolve


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)


def plain_folder(root, name="plain-bert", layers=6, positions=512, tokenizer_limit=None):
    folder = root / name
    write(folder / "config.json", {"model_type": "bert", "num_hidden_layers": layers,
                                   "max_position_embeddings": positions, "hidden_size": 32})
    write(folder / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n")  # what a tokenizer can be built from
    if tokenizer_limit is not None:
        write(folder / "tokenizer_config.json", {"model_max_length": tokenizer_limit})
    return folder


def st_folder(root, name="st-model", modes=("pooling_mode_cls_token",), normalize=True, max_seq_length=128,
              layers=6, positions=512):
    folder = plain_folder(root, name, layers, positions)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    write(folder / "modules.json", modules)
    all_modes = ["pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                 "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                 "pooling_mode_lasttoken"]
    pooling = {"word_embedding_dimension": 32, **{mode: mode in modes for mode in all_modes}}
    write(folder / "1_Pooling" / "config.json", pooling)
    if max_seq_length is not None:
        write(folder / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    return folder


# ----- defaults -----

def test_plain_folder_defaults(tmp_path):
    settings = resolve(model=str(plain_folder(tmp_path)))
    assert settings.pooling.strategy == "mean"
    assert settings.pooling.layers == (-2,)
    assert settings.pooling.normalize is False
    assert settings.pooling.mask_cls_sep is False
    assert settings.max_seq_len == 512
    assert settings.truncate_at == 512
    assert settings.num_layers == 6
    assert settings.pooling_source == "bert-as-service defaults"


def test_plain_folder_limit_from_tokenizer_config(tmp_path):
    settings = resolve(model=str(plain_folder(tmp_path, tokenizer_limit=128)))
    assert settings.max_seq_len == 128
    # the "no limit" sentinel of transformers is ignored
    settings = resolve(model=str(plain_folder(tmp_path, "other", tokenizer_limit=10 ** 30)))
    assert settings.max_seq_len == 512


def test_sentence_transformers_folder_defaults(tmp_path):
    settings = resolve(model=str(st_folder(tmp_path)))
    assert settings.pooling.strategy == "cls"
    assert settings.pooling.layers == (-1,)
    assert settings.pooling.normalize is True
    assert settings.max_seq_len == 128
    assert settings.truncate_at == 128
    assert settings.pooling_source == "sentence-transformers config"


@pytest.mark.parametrize("mode, strategy", [("pooling_mode_mean_tokens", "mean"),
                                            ("pooling_mode_max_tokens", "max"),
                                            ("pooling_mode_cls_token", "cls"),
                                            ("pooling_mode_lasttoken", "last")])
def test_sentence_transformers_pooling_modes(tmp_path, mode, strategy):
    settings = resolve(model=str(st_folder(tmp_path, modes=(mode,), normalize=False)))
    assert settings.pooling.strategy == strategy
    assert settings.pooling.normalize is False


def test_sentence_transformers_without_sentence_bert_config(tmp_path):
    settings = resolve(model=str(st_folder(tmp_path, max_seq_length=None, positions=384)))
    assert settings.max_seq_len == 384


def test_inspect_model_folder(tmp_path):
    info = inspect_model_folder(st_folder(tmp_path, modes=("pooling_mode_mean_tokens",), layers=12))
    assert info.num_layers == 12
    assert info.max_positions == 512
    assert info.st_pooling == "mean"
    assert info.st_normalize is True
    assert info.st_max_seq_len == 128
    plain = inspect_model_folder(plain_folder(tmp_path))
    assert plain.st_pooling is None and plain.st_normalize is False and plain.st_max_seq_len is None


# ----- explicit choices -----

def test_explicit_choices_override_sentence_transformers(tmp_path):
    settings = resolve(model=str(st_folder(tmp_path)), pooling_strategy="mean_max", pooling_layer=[-3, -1],
                       normalize=False, max_seq_len=64, mask_cls_sep=True)
    assert settings.pooling.strategy == "mean_max"
    assert settings.pooling.layers == (-3, -1)
    assert settings.pooling.normalize is False
    assert settings.pooling.mask_cls_sep is True
    assert settings.max_seq_len == 64
    assert settings.truncate_at == 64


def test_explicit_choices_override_plain(tmp_path):
    settings = resolve(model=str(plain_folder(tmp_path)), pooling_strategy="cls", pooling_layer=[0, 6],
                       normalize=True, max_seq_len=None)
    assert settings.pooling.strategy == "cls"
    assert settings.pooling.layers == (0, 6)
    assert settings.pooling.normalize is True
    assert settings.max_seq_len is None
    assert settings.truncate_at == 512


def test_other_settings_pass_through(tmp_path):
    settings = resolve(model=str(plain_folder(tmp_path)), num_worker=2, threads_per_worker=3, port=6000,
                       max_batch_tokens=4096)
    assert settings.num_worker == 2 and settings.threads_per_worker == 3
    assert settings.port == 6000 and settings.max_batch_tokens == 4096
    assert resolve(model=str(plain_folder(tmp_path)), num_worker=1).threads_per_worker >= 1


@pytest.mark.parametrize("cpus", [1, 2, 6, 64])
def test_onnx_on_cpu_runs_one_process_of_lanes_and_torch_a_process_per_cpu(tmp_path, monkeypatch, cpus):
    import encoder_server.settings as settings_module
    monkeypatch.setattr(settings_module, "usable_cpus", lambda: cpus)
    model = str(plain_folder(tmp_path))
    shape = lambda settings: (settings.num_worker, settings.lanes, settings.threads_per_worker)  # noqa: E731
    lanes = min(cpus, 8)
    assert shape(resolve(model=model)) == (1, lanes, cpus // lanes)
    assert shape(resolve(model=model, backend="torch")) == (lanes, 1, cpus // lanes)
    per_worker = max(1, lanes // 2)
    assert shape(resolve(model=model, num_worker=2)) == (2, per_worker, max(1, cpus // (2 * per_worker)))
    assert shape(resolve(model=model, lanes=1)) == (1, 1, cpus)


def test_a_worker_tokenizes_on_one_thread_on_the_cpu_and_on_half_its_cores_on_cuda(tmp_path):
    from types import SimpleNamespace

    from encoder_server.settings import default_tokenizer_threads
    model = str(plain_folder(tmp_path))
    assert resolve(model=model).tokenizer_threads == 1
    assert resolve(model=model, backend="torch", num_worker=1).tokenizer_threads == 1
    assert resolve(model=model, tokenizer_threads=3).tokenizer_threads == 3
    on_cuda = lambda workers, cpus: default_tokenizer_threads(SimpleNamespace(device="cuda", num_worker=workers),  # noqa: E731
                                                              cpus)
    assert [on_cuda(8, 16), on_cuda(2, 16), on_cuda(1, 16), on_cuda(4, 4), on_cuda(8, 64)] == [1, 4, 8, 1, 4]
    with pytest.raises(ConfigError, match="--tokenizer-threads must be at most 64"):
        resolve(model=model, tokenizer_threads=65)


# ----- errors -----

def test_missing_config_json(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError):
        resolve(model=str(tmp_path / "empty"))
    with pytest.raises(ConfigError):
        resolve(model=str(tmp_path / "does-not-exist"))


@pytest.mark.parametrize("in_module", [False, True])
def test_a_folder_without_tokenizer_files_is_refused_at_once(tmp_path, in_module):
    """Not after its workers failed to start three times each (30 s): a tokenizer built from no files
    would know only its special tokens. The files looked for are those of the Transformer module."""
    folder = st_folder(tmp_path)
    if in_module:  # the Transformer module in a subfolder, its vocabulary beside the top folder's config
        modules = json.loads((folder / "modules.json").read_text())
        modules[0]["path"] = "0_Transformer"
        write(folder / "modules.json", modules)
        write(folder / "0_Transformer" / "config.json", json.loads((folder / "config.json").read_text()))
    else:
        (folder / "vocab.txt").unlink()
    where = " \\(in 0_Transformer/\\)" if in_module else ""
    with pytest.raises(ConfigError, match=f"--model {re.escape(str(folder))}: no tokenizer files{where}; it needs "
                                          "tokenizer.json or a vocabulary such as vocab.txt"):
        resolve(model=str(folder))


@pytest.mark.parametrize("text", ["", '{"model": {"vocab": {"[PAD]": 0, "[UNK]": 1'])
def test_a_tokenizer_json_cut_short_is_refused_at_once(tmp_path, text):
    folder = plain_folder(tmp_path)
    write(folder / "tokenizer.json", text)
    with pytest.raises(ConfigError, match=f"--model {re.escape(str(folder))}: {re.escape(str(folder))}/tokenizer"
                                          "\\.json: cut short \\(its JSON object never ends\\); copy or "
                                          "download it again"):
        resolve(model=str(folder))


def test_a_torch_checkpoint_cut_short_is_refused_at_once(tmp_path):
    """torch.save writes a zip archive; a copy cut short lacks the record that ends it. A checkpoint
    in torch's older form (a bare pickle) is not checked."""
    import zipfile
    folder = plain_folder(tmp_path)
    checkpoint = folder / "pytorch_model.bin"
    checkpoint.mkdir()  # no file at all: nothing to check, and no crash
    resolve(model=str(folder))
    checkpoint.rmdir()
    checkpoint.write_bytes(b"\x80\x02a pickle, not a zip")
    resolve(model=str(folder))
    with zipfile.ZipFile(checkpoint, "w") as archive:
        archive.writestr("archive/data.pkl", b"x" * 1000)
    resolve(model=str(folder))
    with open(checkpoint, "r+b") as handle:
        handle.truncate(handle.seek(0, 2) - 10)
    with pytest.raises(ConfigError, match=f"--model {re.escape(str(folder))}: {re.escape(str(checkpoint))}: cut "
                                          "short \\(a zip archive without its end record\\)"):
        resolve(model=str(folder))


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.json", "sentencepiece.bpe.model", "spiece.model"])
def test_any_file_a_tokenizer_is_built_from_will_do(tmp_path, name):
    folder = plain_folder(tmp_path)
    (folder / "vocab.txt").rename(folder / name)
    if name == "tokenizer.json":  # (the workers read it; here only its end is looked at)
        write(folder / name, '{"model": {}}  \n')
    assert resolve(model=str(folder)).encoder_path == str(folder)


def test_config_without_layer_count(tmp_path):
    write(tmp_path / "m" / "config.json", {"max_position_embeddings": 512})
    with pytest.raises(ConfigError):
        resolve(model=str(tmp_path / "m"))


def test_invalid_json(tmp_path):
    write(tmp_path / "m" / "config.json", "{not json")
    with pytest.raises(ConfigError):
        resolve(model=str(tmp_path / "m"))


def test_max_seq_len_above_model_limit(tmp_path):
    folder = plain_folder(tmp_path, positions=256)
    assert resolve(model=str(folder), max_seq_len=256).max_seq_len == 256
    with pytest.raises(ConfigError):
        resolve(model=str(folder), max_seq_len=257)


def test_max_seq_len_above_tokenizer_limit(tmp_path):
    with pytest.raises(ConfigError):
        resolve(model=str(plain_folder(tmp_path, tokenizer_limit=128)), max_seq_len=200)


@pytest.mark.parametrize("value", [0, 1, 2])
def test_max_seq_len_too_small(tmp_path, value):
    with pytest.raises(ConfigError):
        resolve(model=str(plain_folder(tmp_path)), max_seq_len=value)


@pytest.mark.parametrize("layer", [-7, -1, 0, 6])
def test_pooling_layer_in_range(tmp_path, layer):
    assert resolve(model=str(plain_folder(tmp_path, layers=6)), pooling_layer=[layer]).pooling.layers == (layer,)


@pytest.mark.parametrize("layers", [[7], [-8], [-1, 12]])
def test_pooling_layer_out_of_range(tmp_path, layers):
    with pytest.raises(ConfigError):
        resolve(model=str(plain_folder(tmp_path, layers=6)), pooling_layer=layers)


@pytest.mark.parametrize("strategy", ["cls", "last"])
def test_mask_cls_sep_with_unmaskable_strategy(tmp_path, strategy):
    with pytest.raises(ConfigError):
        resolve(model=str(plain_folder(tmp_path)), pooling_strategy=strategy, mask_cls_sep=True)


def test_mask_cls_sep_with_sentence_transformers_cls_default(tmp_path):
    with pytest.raises(ConfigError):
        resolve(model=str(st_folder(tmp_path)), mask_cls_sep=True)


@pytest.mark.parametrize("strategy", ["mean", "max", "mean_max", "none"])
def test_mask_cls_sep_with_maskable_strategy(tmp_path, strategy):
    settings = resolve(model=str(plain_folder(tmp_path)), pooling_strategy=strategy, mask_cls_sep=True)
    assert settings.pooling.mask_cls_sep is True


def test_unknown_strategy(tmp_path):
    with pytest.raises(ConfigError):
        resolve(model=str(plain_folder(tmp_path)), pooling_strategy="median")


@pytest.mark.parametrize("modes", [("pooling_mode_mean_tokens", "pooling_mode_max_tokens"),  # max, then mean
                                   ("pooling_mode_cls_token", "pooling_mode_lasttoken"),
                                   ()])
def test_unsupported_sentence_transformers_pooling(tmp_path, modes):
    folder = st_folder(tmp_path, modes=modes)
    with pytest.raises(ConfigError):
        resolve(model=str(folder))
    settings = resolve(model=str(folder), pooling_strategy="mean")
    assert settings.pooling.strategy == "mean"


def test_the_bulk_jobs_a_worker_holds_are_left_to_its_device_unless_chosen(tmp_path):
    model = str(plain_folder(tmp_path))
    assert resolve(model=model).prefetch_size is None  # each worker's READY says whether it is fast
    assert resolve(model=model, prefetch_size=5).prefetch_size == 5


def test_fp16_without_cuda(tmp_path):
    with pytest.raises(ConfigError):
        resolve(model=str(plain_folder(tmp_path)), fp16=True)
    with pytest.raises(ConfigError):
        resolve(model=str(plain_folder(tmp_path)), fp16=True, device="cpu")


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


# ----- public_config -----

def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


@pytest.mark.parametrize("suffix", ["", "/"])
def test_public_config_has_no_path_and_no_host(tmp_path, suffix):
    folder = st_folder(tmp_path, name="my-model")
    settings = resolve(model=str(folder) + suffix, host="10.9.8.7")
    assert settings.host == "10.9.8.7"
    config = settings.public_config()
    dumped = json.dumps(config)
    assert "host" not in config
    assert "10.9.8.7" not in dumped
    assert str(tmp_path) not in dumped
    assert not any(s.startswith("/") for s in _strings(config))
    assert config["model"] == "my-model"
    assert config["pooling_strategy"] == "cls"
    assert config["pooling_layer"] == [-1]
    assert config["normalize"] is True
    assert config["mask_cls_sep"] is False
    assert config["max_seq_len"] == 128


@pytest.mark.parametrize("sizes, message", [
    ({"num_worker": 0}, "--num-worker must be at least 1"),
    ({"lanes": 0}, "--lanes must be at least 1"),
    ({"lanes": 65}, "--lanes must be at most 64"),
    ({"prefetch_size": 0}, "--prefetch-size must be at least 1"),
    ({"max_batch_tokens": 0}, "--max-batch-tokens must be at least 1"),
    ({"priority_batch_size": 300, "max_batch_size": 256}, "must not exceed --max-batch-size"),
    ({"max_result_mb": 64, "max_unread_mb": 32}, "--max-unread-mb 32 is below --max-result-mb 64"),
])
def test_sizes_that_would_strand_jobs_are_refused(tmp_path, sizes, message):
    with pytest.raises(ConfigError, match=message):
        resolve(model=plain_folder(tmp_path), **sizes)


def test_the_unread_cap_follows_the_largest_result_unless_chosen(tmp_path):
    assert resolve(model=plain_folder(tmp_path), max_result_mb=16).max_unread_mb == 32
    assert resolve(model=plain_folder(tmp_path), max_result_mb=16, max_unread_mb=100).max_unread_mb == 100


@pytest.mark.parametrize("limit, value, message", [
    ("http_keep_alive", -1, "--http-keep-alive must not be negative"),
    ("http_header_timeout", 0, "--http-header-timeout must be at least 1"),
    ("http_body_timeout", 0.5, "--http-body-timeout must be at least 1"),
    ("http_max_connections", 0, "--http-max-connections must be at least 1"),
])
def test_http_limits_are_checked_for_start_and_for_http(tmp_path, capsys, monkeypatch, limit, value, message):
    from encoder_server.cli import _parser, http_limits, main
    from encoder_server.logs import LOG_FORMAT_VARIABLE
    from encoder_server.settings import Settings

    monkeypatch.setenv(LOG_FORMAT_VARIABLE, "text")  # main() sets it: undone after the test

    with pytest.raises(ConfigError, match=message):
        resolve(model=plain_folder(tmp_path), **{limit: value})
    args = _parser().parse_args(["http", "--" + limit.replace("_", "-"), str(value)])
    with pytest.raises(ConfigError, match=message):
        http_limits(args)
    assert main(["http", "--http-port", "1", "--" + limit.replace("_", "-"), str(value)]) == 2  # before serving
    assert message in capsys.readouterr().err
    assert http_limits(Settings()) == {"http_keep_alive": 5.0, "http_header_timeout": 10.0,
                                       "http_body_timeout": 60.0, "http_max_connections": 1000}


def test_http_limits_come_from_the_environment_for_both_commands(monkeypatch):
    from encoder_server.cli import _parser
    from encoder_server.options import env_name

    monkeypatch.setenv(env_name("http_max_connections"), "64")
    monkeypatch.setenv(env_name("http_body_timeout"), "2.5")
    for command in ("start", "http"):
        args = _parser().parse_args([command])
        assert (args.http_max_connections, args.http_body_timeout, args.http_keep_alive) == (64, 2.5, 5.0)
    assert _parser().parse_args(["http", "--http-max-connections", "8"]).http_max_connections == 8


# ----- one source: Settings declares each choice, the CLI and SHOW_CONFIG follow -----

def test_every_choice_is_a_start_option_with_the_declared_default():
    from encoder_server.cli import _parser
    args = vars(_parser().parse_args(["start"]))
    del args["run"]
    assert args == {choice.name: choice.default for choice in CHOICES}


def test_option_choices_come_from_pooling_and_the_backend_table():
    from encoder_server.cli import _parser
    for strategy in STRATEGIES:
        assert _parser().parse_args(["start", "--pooling-strategy", strategy]).pooling_strategy == strategy
    for backend in BACKENDS:
        assert _parser().parse_args(["start", "--backend", backend]).backend == backend
    for flag, value in (("--pooling-strategy", "median"), ("--backend", "tensorrt"), ("--device", "tpu")):
        with pytest.raises(SystemExit):
            _parser().parse_args(["start", flag, value])


def test_show_config_reports_the_choices_under_their_own_names_and_the_real_width(tmp_path):
    settings = resolve(model=str(st_folder(tmp_path, modes=("pooling_mode_mean_tokens",))),
                       pooling_strategy="mean_max", pooling_layer=[-1, -2])
    config = settings.public_config()
    assert {choice.name for choice in CHOICES} - set(config) == {"host", "server_key", "authorized_clients",
                                                                 "api_key", "http_host"}
    assert config["embedding_dim"] == 32 * 2 * 2 == PoolingSpec("mean_max", (-1, -2)).output_width(32)


def test_an_unknown_choice_is_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match="pooling_mode"):
        resolve(model=str(plain_folder(tmp_path)), pooling_mode="mean")


# ----- sentence-transformers module stacks, as each version writes them -----

def with_modules(folder, *extra, pooling=None):
    """Replace the st_folder's modules after the Transformer and its Pooling config."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}]
    for index, (kind, path, config) in enumerate(extra, start=2):
        modules.append({"idx": index, "name": str(index), "path": path, "type": f"sentence_transformers.models.{kind}"})
        if config is not None:
            write(folder / path / "config.json", config)
            (folder / path / "model.safetensors").write_bytes(b"")
    write(folder / "modules.json", modules)
    if pooling is not None:
        write(folder / "1_Pooling" / "config.json", pooling)
    return folder


@pytest.mark.parametrize("pooling, strategy", [
    ({"pooling_mode": "cls"}, "cls"), ({"pooling_mode": "lasttoken"}, "last"),
    ({"pooling_mode": ["mean"]}, "mean"), ({"pooling_mode": ["mean", "max"]}, "mean_max"),
    ({"pooling_mode": "mean_sqrt_len_tokens"}, "mean_sqrt_len"), ({"pooling_mode": "weightedmean"}, "weighted_mean"),
    ({"pooling_mode_weightedmean_tokens": True}, "weighted_mean"),
])
def test_every_pooling_format(tmp_path, pooling, strategy):
    folder = with_modules(st_folder(tmp_path, normalize=False), pooling={"embedding_dimension": 32, **pooling})
    assert resolve(model=str(folder)).pooling.strategy == strategy


def test_include_prompt_false_is_read(tmp_path):
    folder = with_modules(st_folder(tmp_path), pooling={"pooling_mode": "mean", "include_prompt": False})
    assert resolve(model=str(folder)).include_prompt is False
    assert resolve(model=str(st_folder(tmp_path, "other"))).include_prompt is True


def test_dense_and_layer_norm_make_the_head_and_set_the_width(tmp_path):
    dense = {"in_features": 32, "out_features": 8, "bias": True,
             "activation_function": "torch.nn.modules.activation.Tanh"}
    folder = with_modules(st_folder(tmp_path), ("Dense", "2_Dense", dense), ("LayerNorm", "3_LayerNorm", {"dimension": 8}),
                          ("Normalize", "4_Normalize", None))
    settings = resolve(model=str(folder))
    assert [layer.describe() for layer in settings.head] == ["Dense(32->8, Tanh)", "LayerNorm(8)"]
    assert settings.embedding_dim == 8 and settings.public_config()["embedding_dim"] == 8
    assert settings.normalize is True and settings.overrides == ()


def test_pooling_of_another_width_drops_the_head_and_says_so(tmp_path):
    dense = {"in_features": 32, "out_features": 8}
    folder = with_modules(st_folder(tmp_path), ("Dense", "2_Dense", dense))
    settings = resolve(model=str(folder), pooling_strategy="mean_max")
    assert settings.head == () and settings.embedding_dim == 64
    assert any("Dense(32->8, Tanh)" in line and "dropped" in line for line in settings.overrides)
    assert any("--pooling-strategy mean_max replaces the model's own cls" in line for line in settings.overrides)
    same_width = resolve(model=str(folder), pooling_strategy="mean")
    assert same_width.embedding_dim == 8 and len(same_width.head) == 1


@pytest.mark.parametrize("extra, message", [
    ([("WordWeights", "2_WordWeights", {})], "'sentence_transformers.models.WordWeights'"),
    ([("Normalize", "2_Normalize", None), ("Dense", "3_Dense", {"in_features": 32, "out_features": 8})],
     "module 3 is 'sentence_transformers.models.Dense', which this server cannot reproduce (the server reproduces "
     "a Transformer, one Pooling, then Dense and LayerNorm modules and a final Normalize, in that order)"),
    ([("Dense", "2_Dense", {"in_features": 16, "out_features": 8})], "takes 16 features"),
    ([("Dense", "2_Dense", {"in_features": 32, "out_features": 8, "activation_function": "mylib.Swish"})],
     "'mylib.Swish'"),
    ([("Dense", "2_Dense", {"in_features": 32, "out_features": 0})], "out_features"),
    ([("Dense", "2_Dense", None)], "2_Dense/config.json: missing"),
])
def test_a_module_the_server_cannot_reproduce_is_a_start_up_error(tmp_path, extra, message):
    folder = with_modules(st_folder(tmp_path), *extra)
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(model=str(folder))


def test_malformed_modules_json(tmp_path):
    folder = st_folder(tmp_path)
    write(folder / "modules.json", "[{]")
    with pytest.raises(ConfigError, match="not valid JSON"):
        resolve(model=str(folder))
    write(folder / "modules.json", {"idx": 0})
    with pytest.raises(ConfigError, match="a list of modules"):
        resolve(model=str(folder))
    (folder / "1_Pooling" / "config.json").unlink()
    with_modules(folder)
    with pytest.raises(ConfigError, match="1_Pooling/config.json: missing"):
        resolve(model=str(folder))


def test_transformer_in_a_subfolder_as_version_2_saved_it(tmp_path):
    root = tmp_path / "v2-model"
    plain_folder(root, "0_Transformer", layers=4)
    write(root / "modules.json", [{"idx": 0, "name": "0", "path": "0_Transformer",
                                   "type": "sentence_transformers.models.Transformer"},
                                  {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    write(root / "1_Pooling" / "config.json", {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True})
    settings = resolve(model=str(root))
    assert settings.encoder_path == str(root / "0_Transformer") and settings.num_layers == 4
    assert settings.model_name[0] == "v2-model"


def test_prompts_and_the_default_prompt_name(tmp_path):
    folder = st_folder(tmp_path)
    write(folder / "config_sentence_transformers.json", {"prompts": {"query": "query: ", "passage": "passage: "},
                                                         "default_prompt_name": "query"})
    settings = resolve(model=str(folder))
    assert settings.prompts == {"query": "query: ", "passage": "passage: "}
    assert settings.default_prompt_name == "query"
    assert resolve(model=str(folder), default_prompt_name="passage").default_prompt_name == "passage"
    with pytest.raises(ConfigError, match="no such prompt"):
        resolve(model=str(folder), default_prompt_name="document")


def test_served_names(tmp_path):
    snapshot = plain_folder(tmp_path / "hub" / "models--acme--tiny-encoder" / "snapshots", "0123abcd")
    settings = resolve(model=str(snapshot), model_name=["small", "small"])
    assert settings.model_name == ("acme/tiny-encoder", "small", "text-embedding-ada-002")
    assert settings.public_config()["model_name"] == "acme/tiny-encoder"
    assert settings.public_config()["model_names"] == list(settings.model_name)


def test_every_option_may_come_from_the_environment(monkeypatch):
    """For containers: ENCODER_SERVER_<NAME>, read as the flag would be; a flag given still wins."""
    from encoder_server.cli import _parser
    from encoder_server.options import env_name

    values = {"num_worker": "3", "pooling_layer": "-1 -2", "pooling_strategy": "cls", "mask_cls_sep": "true",
              "normalize": "no", "api_key": "sk-from-env", "model_name": "a,b", "drain_timeout": "2.5",
              "max_seq_len": "none", "worker_port": "6000"}
    for name, value in values.items():
        monkeypatch.setenv(env_name(name), value)
    args = _parser().parse_args(["start"])
    assert (args.num_worker, args.pooling_layer, args.pooling_strategy, args.mask_cls_sep, args.normalize) == \
        (3, [-1, -2], "cls", True, False)
    assert (args.api_key, args.model_name, args.drain_timeout, args.max_seq_len, args.worker_port) == \
        ("sk-from-env", ["a", "b"], 2.5, None, 6000)
    assert _parser().parse_args(["start", "--num-worker", "5"]).num_worker == 5
    assert _parser().parse_args(["http"]).api_key == "sk-from-env"
    assert {setting.name for setting in CHOICES} >= set(values)
    monkeypatch.setenv(env_name("verbose"), "maybe")
    with pytest.raises(SystemExit, match="ENCODER_SERVER_VERBOSE='maybe': use one of"):
        _parser()
