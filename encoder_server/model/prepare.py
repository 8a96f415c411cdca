"""A model made ready to serve: its ONNX file built once and cached (int8 checked first), in this
process or in a child of its own; `load` gives an Embedder ready to use."""
from dataclasses import replace

from .model_folder import ConfigError
from .spec import RERANK, SPARSE, ModelSpec, resolve_spec


def load(model=None, **choices):
    """An Embedder for a model folder or Hugging Face id (default: the bundled all-MiniLM-L6-v2), a
    Reranker for a cross-encoder, or a SparseEmbedder for a SparseEncoder (SPLADE), taking the model's
    choices that `encoder-server start` takes, as keywords (pooling_strategy="cls", quantize="int8").
    Its passes use every usable core unless threads_per_worker says otherwise."""
    return open_model(prepare_model(resolve_spec(ModelSpec(model=model, **choices))))


def open_model(spec, lone_threads=0, python_pieces=True):
    """The Embedder of a prepared spec, or for a spec of kind rerank its Reranker, of kind sparse its
    SparseEmbedder (`lone_threads` and `python_pieces` as they take them)."""
    if spec.kind == RERANK:
        from .reranker import Reranker
        return Reranker(spec, lone_threads, python_pieces)
    if spec.kind == SPARSE:
        from .sparse_encoder import SparseEmbedder
        return SparseEmbedder(spec, lone_threads, python_pieces)
    from .embedder import Embedder
    return Embedder(spec, lone_threads, python_pieces)


def prepare_model(spec):
    """The resolved spec ready to run: for onnx, the cached (built once) file to serve, int8 checked first."""
    if spec.backend != "onnx":
        return spec
    from .model_cache import onnx_files
    fp32_file, served_file = onnx_files(spec)
    if spec.quantize == "int8":
        from .quantization_check import check_int8
        check_int8(spec, fp32_file, served_file)
    return replace(spec, onnx_file=str(served_file))


def prepare_model_apart(spec, process_name="model", verbose=False):
    """prepare_model in a child process, so that the caller (the supervisor, a remote worker's
    host) never holds what the export and the int8 check load: torch, transformers' model code and
    two ONNX sessions, about 400 MB that it would keep for its whole life. When there is nothing
    to build or check (the torch backend, or a cached ONNX file and no int8), no child is needed."""
    if spec.backend != "onnx":
        return spec
    from .model_cache import served_file_if_cached

    served = served_file_if_cached(spec)
    if served is not None:
        return replace(spec, onnx_file=str(served))
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from ..logs import configure_logging

    with ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), initializer=configure_logging,
                             initargs=(process_name, verbose)) as child:
        try:
            return child.submit(prepare_model, spec).result()
        except BrokenProcessPool:
            raise ConfigError("the process preparing the model died (killed, or out of memory); "
                              "see the log above") from None
