"""encoder_server.served_models and settings.resolve with several models: the models file, names,
per-model choices over shared ones, and each model's share of the cores."""
import pytest

from encoder_server.model.cpus import usable_cpus
from encoder_server.model.model_folder import ConfigError
from encoder_server.served_models import read_models_file
from encoder_server.settings import resolve


def models_file(tmp_path, text):
    path = tmp_path / "models.toml"
    path.write_text(text)
    return str(path)


def test_a_models_file_gives_each_model_its_names_and_choices_over_the_shared_ones(tiny_model,
                                                                                  tiny_cross_encoder, tmp_path):
    path = models_file(tmp_path, f"""
[[models]]
names = ["small", "queries"]
model = "{tiny_model}"
max_seq_len = 32
pooling_layer = -1
prompts = {{ query = "query: " }}
default_prompt_name = "query"

[[models]]
name = "ce"
model = "{tiny_cross_encoder}"
kind = "rerank"
backend = "torch"
threads_per_worker = 1
tokenizer_threads = 2
""")
    settings = resolve(models=path, max_batch_size=32, model_name=None)
    small, ce = settings.served
    assert settings.name == "small" and small.model_name[:2] == ("small", "queries")
    assert "text-embedding-ada-002" in small.model_name and "text-embedding-ada-002" not in ce.model_name
    assert (small.max_seq_len, small.pooling_layer, small.prompts["query"]) == (32, (-1,), "query: ")
    assert (ce.kind, ce.backend, ce.threads_per_worker, ce.embedding_dim) == ("rerank", "torch", 1, 1)
    assert (small.tokenizer_threads, ce.tokenizer_threads) == (1, 2)
    assert small.max_batch_size == ce.max_batch_size == 32  # the command line's, shared
    config = settings.public_config()
    assert [model["model_name"] for model in config["models"]] == ["small", "ce"]
    assert config["models"][1]["kind"] == "rerank" and config["prompts"]["query"] == "query: "


def test_several_models_share_the_cores(tiny_model, tiny_cross_encoder):
    one = resolve(model=[str(tiny_model)])
    two = resolve(model=[str(tiny_model), str(tiny_cross_encoder)], model_name=["alias"])
    assert "alias" in two.served[0].model_name and "alias" not in two.served[1].model_name
    assert len(one.served) == 1 and len(two.served) == 2
    cores = [model.num_worker * model.lanes * model.threads_per_worker for model in two.served]
    assert one.lanes * one.threads_per_worker == usable_cpus()  # one model: every core
    assert sum(cores) <= max(usable_cpus(), 2)  # two: each its share, so one's load leaves the other's alone


@pytest.mark.parametrize("text, message", [
    ("models = 3", "no \\[\\[models\\]\\] tables"),
    ("[[models]]\nport = 5", "'port' is not a model's choice"),
    ("[[models]]\nnum_worker = 'two'", "num_worker must be a int"),
    ("[[models]]\nname = ''", "name\\(s\\) must be non-empty strings"),
    ("[[models]]\nname = 'a'\nnames = ['b']", "name or names, not both"),
    ("[[models]]\nprompts = ['x']", "prompts must be a table"),
    ("[[models]\n", "not valid TOML"),
    ("[other]\n[[models]]", "unknown key 'other'"),
])
def test_a_bad_models_file_is_refused_with_the_reason(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        read_models_file(models_file(tmp_path, text))


def test_two_models_may_not_share_a_name_and_model_with_models_is_refused(tiny_model, tmp_path):
    path = models_file(tmp_path, f'[[models]]\nname = "a"\nmodel = "{tiny_model}"\n'
                                 f'[[models]]\nname = "a"\nmodel = "{tiny_model}"\n')
    with pytest.raises(ConfigError, match="two models answer to the name 'a'"):
        resolve(models=path)
    with pytest.raises(ConfigError, match="--model and --models together"):
        resolve(models=path, model=[str(tiny_model)])
    with pytest.raises(ConfigError, match="No such file"):
        resolve(models=str(tmp_path / "missing.toml"))


def test_start_takes_model_several_times_and_the_models_file_from_the_environment(monkeypatch):
    from encoder_server.cli import _parser

    args = _parser().parse_args(["start", "--model", "a", "--model", "b"])
    assert args.model == ["a", "b"] and args.models is None
    monkeypatch.setenv("ENCODER_SERVER_MODELS", "/etc/models.toml")
    assert _parser().parse_args(["check"]).models == "/etc/models.toml"


def test_the_readme_models_file_example_reads(tmp_path):
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    example = "#" + readme.split("```toml\n#", 1)[1].split("```", 1)[0]
    entries = read_models_file(models_file(tmp_path, example))
    assert [entry["names"][0] for entry in entries] == ["minilm", "e5", "reranker"]
    assert "model" not in entries[0] and entries[2]["kind"] == "rerank"
