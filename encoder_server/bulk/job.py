"""One bulk job: stage the checked input, then embed every unfinished shard on Ray Data, each
by an actor that reads its row group, embeds it with `integrations.ray.Embed` and writes its
part file. A shard is written whole or not at all, so a job killed at any point is finished by
running it again, and a shard that Ray retries (its actor died) is only written again."""
import os
import socket
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from . import shards
from .source import checked_batches

ROW = "_row"  # the staged file's row numbers, 0-based over the input's data rows


def stage_input(plan, output):
    """Copy the input's checked rows to OUTPUT/_texts.parquet, one row group per shard; return the
    plan with its row count. A folder already staged for this same job is reused as it is."""
    output = Path(output)
    done = shards.read_manifest(output)
    if done is not None and not done.same_job(plan):
        raise shards.OutputError(f"{output} holds the output of another job ({_difference(done, plan)}); "
                                 f"choose another folder, or remove this one to start again")
    if done is not None and (output / shards.TEXTS).is_file():
        return done
    rows = 0

    def write(path):
        nonlocal rows
        writer = None
        try:
            for group in _row_groups(plan):
                writer = writer or pq.ParquetWriter(path, group.schema)
                writer.write_table(group, row_group_size=plan.shard_rows)
                rows += group.num_rows
        finally:
            if writer is not None:
                writer.close()

    shards.atomic_write(output / shards.TEXTS, write)
    staged = replace(plan, rows=rows)
    shards.write_manifest(output, staged)
    return staged


def _row_groups(plan):
    """Tables of exactly shard_rows rows (the last one shorter), in the staged file's columns."""
    pending, count = [], 0
    for batch, first in checked_batches(plan.input, plan.column, plan.id_column):
        columns = {ROW: pa.array(range(first, first + batch.num_rows), pa.int64()),
                   "text": batch.column(plan.column).cast(pa.string())}
        if plan.id_column:
            columns[plan.id_column] = batch.column(plan.id_column)
        pending.append(pa.table(columns))
        count += batch.num_rows
        while count >= plan.shard_rows:
            table = pa.concat_tables(pending, promote_options="permissive")
            yield table.slice(0, plan.shard_rows)
            pending, count = [table.slice(plan.shard_rows)], count - plan.shard_rows
    if count:
        yield pa.concat_tables(pending, promote_options="permissive")


def _difference(done, plan):
    for name in ("input", "column", "id_column", "options", "shard_rows", "input_size", "input_mtime_ns"):
        if getattr(done, name) != getattr(plan, name):
            return f"{name} was {getattr(done, name)!r}, is now {getattr(plan, name)!r}"
    return "unknown"


class ShardEmbedder:
    """A Ray Data actor: for each shard number in its batch, read the shard's row group, embed it
    and write its part file; return one row per shard (shard, rows, node, host, pid)."""

    def __init__(self, output, plan, embed_options):
        from ..integrations.ray import Embed

        self.output, self.plan = output, plan
        self.embed = Embed(column="text", output_column="embedding", **embed_options)
        self.staged = pq.ParquetFile(Path(output) / shards.TEXTS)

    def __call__(self, batch):
        import ray

        done = []
        for shard in batch.column("shard").to_pylist():
            table = self.embed(self.staged.read_row_group(shard))
            self._check(shard, table)
            ids = table.column(self.plan.id_column) if self.plan.id_column else table.column(ROW)
            shards.write_shard(self.output, self.plan, shard,
                               pa.table({self.plan.id_column or "id": ids, "embedding": table.column("embedding")}))
            done.append(shard)
        return pa.table({"shard": done, "rows": [self.plan.rows_of(shard) for shard in done],
                         "node": [ray.get_runtime_context().get_node_id()] * len(done),
                         "host": [socket.gethostname()] * len(done), "pid": [os.getpid()] * len(done)})

    def _check(self, shard, table):
        first = shard * self.plan.shard_rows
        if table.column(ROW).to_pylist() != list(range(first, first + self.plan.rows_of(shard))):
            raise RuntimeError(f"{self.output}/{shards.TEXTS}: row group {shard} does not hold rows {first} on; "
                               f"remove the folder to start again")


def run_shards(plan, output, todo, actors, cpus_per_actor, embed_options):
    """Embed the shards `todo` on the connected Ray cluster; yield a dict per finished shard. Ray
    Data restarts a dead actor and retries its shard (max_restarts and max_task_retries are -1)."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.verbose_stats_logs = False
    descriptors = ray.data.from_items([{"shard": shard} for shard in todo], override_num_blocks=len(todo))
    statuses = descriptors.map_batches(
        ShardEmbedder, fn_constructor_args=(str(output), plan, embed_options), batch_size=1, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=max(1, min(actors, len(todo)))), num_cpus=cpus_per_actor)
    yield from statuses.iter_rows()
