"""What a GPU machine lent to a session needs to run the project (see ../shared/MEASURED.md): it has
torch, transformers, sentence-transformers and pytest, but no pyzmq, orjson, platformdirs or
bundled model, and no package index, and at most 64 MiB travel with the working tree. So:

    python -m benchmark.device_kit pack [.device]      # here: wheels and the model, weights in fp16
    python3 -m benchmark.device_kit unpack [.device]   # there: wheels into .device/site, weights in fp32
    export PYTHONPATH=$PWD/.device/site:$PWD          # there; the model is .device/model

`pack` writes the wheels of the pyzmq, orjson, platformdirs and py-spy installed here, for CPython
3.12 on x86-64 Linux (the GPU machines' Python; py-spy's program lands in .device/site/bin), and a
copy of the model folder whose safetensors weights hold their floating tensors in fp16 (the bundled
model's 91 MB become 45 MB); other weight formats (ONNX exports, pytorch_model.bin) are left out.
`unpack` widens those tensors back to their own dtype: each value is the fp16 rounding of the
original, so rows differ from the original model's a little (row cosine 0.9999994 at worst on 64
random texts, values by up to 2e-4), and a check on that machine compares with sentence-transformers
on the same folder.
Name the folder in `carry` (it is git-ignored).
"""
import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

LIMIT = 64 << 20             # bytes that travel with the working tree, this kit included
WHEELS = ("pyzmq", "orjson", "platformdirs", "py-spy")  # what the GPU machines lack (py-spy: cpu_split's)
NARROWED = "narrowed"         # the fp16 file's metadata key: {tensor name: its own dtype}
SKIPPED = ("*.onnx", "*.onnx.data", "*.bin", "*.h5", "*.msgpack", "*.ot")


def pack(kit, model=None, wheels=True):
    """Fill `kit` with the model folder (None: the bundled model), weights narrowed, and with
    `wheels`, the wheels; returns the kit's size in bytes, which must stay well under LIMIT."""
    from encoder_server.model.model_folder import default_model_path  # (unpack runs where pyzmq is not yet)
    kit = Path(kit)
    source = Path(model) if model else default_model_path()
    target = kit / "model"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors", *SKIPPED))
    for weights in source.rglob("*.safetensors"):
        narrow(weights, target / weights.relative_to(source))
    if wheels:
        download_wheels(kit / "wheels")
    return sum(path.stat().st_size for path in kit.rglob("*") if path.is_file())


def unpack(kit):
    """Widen the model's weights in place, and install the wheels (if any) into `kit`/site."""
    kit = Path(kit)
    for weights in (kit / "model").rglob("*.safetensors"):
        widen(weights)
    wheels = sorted((kit / "wheels").glob("*.whl"))
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", str(kit / "site"), *map(str, wheels)], check=True)


def narrow(source, target):
    """Write `source`'s tensors to `target`, floating ones wider than fp16 as fp16, saying in the
    file's metadata which ones and their own dtypes. ValueError for a value past fp16's range."""
    from safetensors.torch import load_file, save_file

    tensors, narrowed = load_file(source), {}
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and tensor.element_size() > 2:
            half = tensor.half()
            if not half.isfinite().all() and tensor.isfinite().all():
                raise ValueError(f"{source}: {name} holds values past fp16's range; it cannot travel narrowed")
            tensors[name], narrowed[name] = half, str(tensor.dtype).removeprefix("torch.")
    save_file(tensors, target, metadata={NARROWED: json.dumps(narrowed)})


def widen(path):
    """Give the tensors that narrow() made fp16 their own dtypes again, in place (once: a file
    without the metadata, or widened already, is left as it is)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(path, "pt") as weights:
        narrowed = json.loads((weights.metadata() or {}).get(NARROWED, "{}"))
    if not narrowed:
        return
    tensors = load_file(path)
    for name, dtype in narrowed.items():
        tensors[name] = tensors[name].to(getattr(torch, dtype))
    save_file(tensors, path)


def download_wheels(folder, python="3.12"):
    """The wheels of WHEELS, at the versions installed here, for CPython `python` on x86-64 Linux."""
    from importlib.metadata import version

    platforms = [argument for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for argument in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python, "--implementation", "cp", *platforms, "-d", str(folder),
                    *(f"{name}=={version(name)}" for name in WHEELS)], check=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("pack", "unpack"))
    parser.add_argument("kit", nargs="?", default=".device")
    parser.add_argument("--model", help="model folder to pack (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--no-wheels", action="store_true", help="pack the model alone")
    args = parser.parse_args(argv)
    if args.step == "unpack":
        unpack(args.kit)
        print(f"export PYTHONPATH={Path(args.kit).resolve() / 'site'}:$PWD; the model: {args.kit}/model")
        return 0
    size = pack(args.kit, args.model, wheels=not args.no_wheels)
    print(f"{args.kit}: {size / 2 ** 20:.1f} MiB of the {LIMIT >> 20} MiB that travel with the working tree")
    return 0 if size < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
