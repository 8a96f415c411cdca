"""`encoder-server bulk INPUT OUTPUT --column text`: the command's steps, in order."""
import logging
import os
import sys
from pathlib import Path

from . import MODEL_OPTIONS, REQUEST_OPTIONS, shards
from .job import run_shards, stage_input
from .source import InputError, input_format

SERVER_OPTIONS = ("port", "port_out", "server_key", "client_key", "timeout")


def bulk(args):
    """Exit status 0 when every shard is written and verified; 2 for bad input or a folder of
    another job."""
    try:
        plan = _plan(args)
        output = Path(args.output)
        output.mkdir(parents=True, exist_ok=True)
        shards.remove_leftovers(output)
        plan = stage_input(plan, output)
    except (InputError, shards.OutputError) as error:
        print(f"encoder-server bulk: {error}", file=sys.stderr)
        return 2
    todo = shards.pending_shards(output, plan)
    done_rows = plan.rows - sum(plan.rows_of(shard) for shard in todo)
    if todo:
        per_node = _embed(args, plan, output, todo, done_rows)
        print("shards written per Ray node: " + ", ".join(f"{node[:12]} {count}" for node, count in per_node.items()))
    missing = shards.pending_shards(output, plan)
    if missing:
        print(f"encoder-server bulk: shards {missing[:10]} were not written; run the command again", file=sys.stderr)
        return 1
    shards.remove_leftovers(output)  # again: a killed run's actor may have outlived the first sweep
    print(f"{plan.rows} rows embedded in {output} ({plan.shards} shards, {len(todo)} written now)")
    return 0


def _plan(args):
    source = Path(args.input)
    input_format(source)
    if not source.is_file():
        raise InputError(f"{source}: no such file")
    stat = source.stat()
    options = {name: _plain(getattr(args, name)) for name in MODEL_OPTIONS if getattr(args, name) is not None}
    if args.connect:
        options = {"address": args.connect, **{name: _plain(getattr(args, name)) for name in SERVER_OPTIONS},
                   **{name: options[name] for name in REQUEST_OPTIONS if name in options}}
    return shards.Plan(input=str(source.resolve()), input_size=stat.st_size, input_mtime_ns=stat.st_mtime_ns,
                       column=args.column, id_column=args.id_column, options=options, shard_rows=args.shard_rows)


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _embed(args, plan, output, todo, done_rows):
    """Run the shards `todo` under a progress bar; {Ray node id: shards it wrote}."""
    from collections import Counter

    from tqdm import tqdm

    ray = _connect_ray(args.ray_address)
    per_node = Counter()
    try:
        cpus = args.cpus_per_actor or (0.25 if args.connect else 1)
        actors = args.actors or max(1, int(ray.cluster_resources().get("CPU", 1) // cpus))
        with tqdm(total=plan.rows, initial=done_rows, unit="text", unit_scale=True, desc="embedding",
                  disable=args.quiet, file=sys.stderr) as bar:
            for status in run_shards(plan, output, todo, actors, cpus, plan.options):
                bar.update(status["rows"])
                per_node[status["node"]] += 1
    finally:
        ray.shutdown()
    return per_node


def _connect_ray(address):
    """A new local Ray on this host's usable CPUs (never a cluster that happens to run here), or
    the cluster at `address`, quietly (Ray's own progress bars and notices off: the command
    shows its own bar), and without Ray Data's usage collection, whose thread polls a Prometheus
    at localhost:9090 (each of these can be set otherwise in the environment)."""
    os.environ.setdefault("RAY_DATA_LOG_LEVEL", "ERROR")
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    os.environ.setdefault("RAY_DATA_USAGE_DISABLED", "1")
    import ray

    from ..model.cpus import usable_cpus

    local = {} if address else {"num_cpus": usable_cpus(), "include_dashboard": False}
    ray.init(address=address or "local", logging_level=logging.ERROR, log_to_driver=False, **local)
    return ray
