"""ONNX files built once per model, pooling and precision, kept in a user cache folder.

The cache key covers the model folder's content, every setting baked into the graph and the
versions of the tools that built it, so a changed model or upgrade never reuses a stale file.
An install without the exporters (torch, transformers, onnx: the lean container image) cannot
build, so it serves an entry built elsewhere for the same model and settings, whichever versions of
them built it. Concurrent starts share one build through a file lock; a read-only cache needs none.
Each build lists the sha256 of every file it wrote in CHECKSUMS; an entry whose files no longer
match (a truncated copy, a full disk) or that has no such list is built again, with a warning,
rather than handed to the workers.

The weights live beside the graph in model.onnx.data, which ONNX Runtime maps into memory instead
of copying: the workers of a host share one copy in the page cache, and the embedding table's rows
that no text uses are never read.
"""
import errno
import glob
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

from . import onnx_export
from .model_folder import ConfigError
from .spec import RERANK, SPARSE

log = logging.getLogger(__name__)
FORMAT = 3  # 2: a pool_mask input, the model's head inside, no normalization; 3: weights in model.onnx.data
CACHE_ENV = "ENCODER_SERVER_CACHE"
CHECKSUMS = "checksums.json"  # file name -> sha256, beside model.onnx (and any external-data files)
EXPORTERS = ("torch", "transformers", "onnx")  # what building files needs, beyond what serving them does


def cache_root():
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    from platformdirs import user_cache_dir
    return Path(user_cache_dir("encoder-server")) / "onnx"


def onnx_files(spec):
    """(fp32 file, served file) for this spec, building whatever the cache lacks. A build that fails
    (weights that cannot be read, an architecture the exporter cannot trace) is a ConfigError that
    names the model and the cause; the traceback is logged at debug level (--verbose)."""
    try:
        return _onnx_files(spec)
    except ConfigError:
        raise
    except Exception as error:
        log.debug("building the ONNX file of %s failed", spec.model, exc_info=True)
        raise ConfigError(f"--model {spec.model}: its ONNX file could not be built: "
                          f"{type(error).__name__}: {error}") from error


def _onnx_files(spec):
    fp32 = _cached(_entry(spec, "fp32"), lambda target: onnx_export.export(spec, target))
    if spec.quantize == "int8":
        return fp32, _cached(_entry(spec, "int8"), lambda target: onnx_export.quantize(fp32, target, spec))
    if spec.fp16:
        return fp32, _cached(_entry(spec, "fp16"), lambda target: onnx_export.to_fp16(fp32, target))
    return fp32, fp32


def served_file_if_cached(spec):
    """The file to serve for a spec without int8 when the cache holds it whole, else None; this
    builds nothing and loads neither torch nor ONNX Runtime."""
    if spec.quantize == "int8":
        return None
    folder = cache_root() / _entry(spec, "fp16" if spec.fp16 else "fp32")
    if not (folder / "model.onnx").exists():
        return None
    with _lock(folder):
        usable = (folder / "model.onnx").exists() and _damage(folder) is None
    if usable:
        log.info("using cached %s", folder / "model.onnx")
    return folder / "model.onnx" if usable else None


def _cached(key, build):
    folder = cache_root() / key
    target = folder / "model.onnx"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _lock(folder):
        if target.exists():
            damage = _damage(folder)
            if damage is None:
                log.info("using cached %s", target)
                return target
            log.warning("cached ONNX entry unusable: %s; building it again", damage)
        if not _can_export():
            raise ConfigError(f"the ONNX cache ({cache_root()}) has no usable {key} for these settings, and this "
                              f"install cannot build it: that needs {', '.join(EXPORTERS)} (pip install "
                              "'encoder-server[server]', or the container image's full target)")
        log.info("building %s (once; later starts reuse it)", target)
        shutil.rmtree(folder, ignore_errors=True)  # a build interrupted before it was complete
        for stale in folder.parent.glob(f".build-{key}-*"):  # left by a builder killed mid-way; we hold its lock
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".build-{key}-"))
        try:
            with _scratch_folder(staging / "scratch"):
                build(staging / "model.onnx")
            _write_checksums(staging)  # before the rename: a complete folder always has them
            staging.rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _can_export():
    return all(importlib.util.find_spec(tool) is not None for tool in EXPORTERS)


@contextmanager
def _lock(folder):
    """The entry's file lock, held while it is checked or built. Where the lock file cannot be
    made (a read-only cache, say a container's read-only root), nothing else can change the entry
    either, so it is read unlocked."""
    lock = FileLock(str(folder) + ".lock", timeout=600)
    try:
        lock.acquire()
    except OSError as error:
        if error.errno not in (errno.EROFS, errno.EACCES):
            raise
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _write_checksums(folder):
    sums = {path.name: _sha256(path) for path in sorted(folder.iterdir()) if path.is_file()}
    (folder / CHECKSUMS).write_text(json.dumps(sums, indent=1))


def _damage(folder):
    """Why a cached folder cannot be served, naming the file; None when every file matches its sha256."""
    try:
        sums = json.loads((folder / CHECKSUMS).read_text())
    except FileNotFoundError:
        return f"{folder / CHECKSUMS} is missing (built before checksums were kept)"
    except ValueError:
        return f"{folder / CHECKSUMS} is unreadable"
    if not isinstance(sums, dict) or "model.onnx" not in sums:
        return f"{folder / CHECKSUMS} does not list model.onnx"
    for name, expected in sums.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if _sha256(path) != expected:
            return f"{path} does not match its sha256 in {CHECKSUMS} (truncated or changed since it was built)"
    return None


@contextmanager
def _scratch_folder(path):
    """Point temp files of the export tools (torch's compile cache and others) into `path`, then remove it."""
    path.mkdir()
    saved_env, saved_default = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(path), str(path)
    try:
        yield
    finally:
        tempfile.tempdir = saved_default
        if saved_env is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(path, ignore_errors=True)


def _entry(spec, precision):
    """The name of the cache entry to use: the key, or where this install cannot export, an entry
    that another install built for the same recipe (it differs only in the exporters' versions)."""
    key = _key(spec, precision)
    if _can_export():
        return key
    same_recipe = sorted(Path(path).parent.name for path in
                         glob.glob(glob.escape(str(cache_root() / key.rsplit("-", 1)[0])) + "-*/model.onnx"))
    return key if key in same_recipe or not same_recipe else same_recipe[0]


def _key(spec, precision):
    """<model>-<precision>-<digest of the recipe>-<digest of the exporters' versions>."""
    recipe = {"format": FORMAT, "model": _folder_digest(spec.encoder_path), "precision": precision,
              "head": [[layer.describe(), _folder_digest(layer.folder)] for layer in spec.head],
              "int8": onnx_export.int8_recipe() if precision == "int8" else None,
              "pooling": [spec.pooling.strategy, list(spec.pooling.layers), spec.num_layers],
              "opset": onnx_export.OPSET, "onnxruntime": _version("onnxruntime")}
    if spec.kind == RERANK:  # a scoring graph, not a pooled one (embedders' keys stay as they were)
        recipe.update(kind=RERANK, pooling=None)
    if spec.kind == SPARSE:  # a SPLADE graph: the MLM head, then its pooling
        recipe.update(kind=SPARSE, pooling=[spec.splade_pooling, spec.splade_activation])
    exporters = {tool: _version(tool) for tool in EXPORTERS}
    return f"{Path(spec.model).name[:60]}-{precision}-{_digest(recipe)}-{_digest(exporters)}"


def _digest(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _version(distribution):
    """An installed tool's version, read without importing it (importing torch costs 260 MB)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _folder_digest(folder):
    """Content hash of the model folder's top-level files (config, weights, tokenizer)."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).iterdir()):
        if path.is_file():
            digest.update(path.name.encode())
            _feed(digest, path)
    return digest.hexdigest()


def _sha256(path):
    return _feed(hashlib.sha256(), path).hexdigest()


def _feed(digest, path):
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest
