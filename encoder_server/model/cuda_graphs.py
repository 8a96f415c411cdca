"""CUDA graphs for the torch backend on cuda (on by default; `--no-cuda-graphs`). A small encoder's
forward pass is hundreds of kernel launches: on H200 hosts one short text's pass took 2.3 to 4.8 ms
of host time, most of a batch-1 request's latency, while the GPU computed it in a fraction of that.
A graph captured once for a shape replays all of its kernels with one launch (0.45 ms a pass).

A graph holds one shape, so a pass is padded to a few: its rows to a power of two up to 8, then
to a multiple of 8; its columns to a multiple of 16. Padding rows are a lone [CLS]-position token
(attending to itself, pooled alone), padding columns are masked out, so the real rows' values are
those of the unpadded pass. Each shape is captured the first time it comes; all of a backend's
graphs draw on one memory pool, and a lock runs one pass at a time, each one's rows copied out
before the next replays. Passes above the token budget (the model's own max_batch_tokens) run
without a graph, and so do new shapes once the graphs' outputs, which each graph keeps, hold
OUTPUT_BYTES: a dense model's rows are small, but a sparse model's are vocabulary-wide and
token-level pooling's a row per token.
"""
import logging
import threading

import numpy as np

from .passes import Pass

log = logging.getLogger(__name__)
ROW_STEP = 8      # rows beyond 8 pad to a multiple of this
COLUMN_STEP = 16  # columns pad to a multiple of this
OUTPUT_BYTES = 256 << 20  # what one backend's graphs may keep in outputs


def padded_shape(rows, columns):
    """(rows, columns) of the graph that runs a pass of this shape."""
    padded_rows = 1 << (rows - 1).bit_length() if rows <= ROW_STEP else -(-rows // ROW_STEP) * ROW_STEP
    return padded_rows, -(-columns // COLUMN_STEP) * COLUMN_STEP


def pad_pass(inputs, rows, columns):
    """`inputs` (a Pass) padded to `rows` x `columns`: masked columns, and rows of one token that
    attends to itself alone, so that no row of the padded pass is empty."""
    real_rows, real_columns = inputs.input_ids.shape

    def grow(array):  # zeros written over: a 20th of np.pad's time (1.6 against 28 µs for 27 x 19)
        grown = np.zeros((rows, columns), dtype=array.dtype)
        grown[:real_rows, :real_columns] = array
        return grown
    attention_mask, pool_mask = grow(inputs.attention_mask), grow(inputs.pool_mask)
    attention_mask[real_rows:, 0] = pool_mask[real_rows:, 0] = 1
    return Pass(grow(inputs.input_ids), attention_mask, pool_mask, grow(inputs.token_type_ids))


class GraphedModel:
    """A torch module on a CUDA device, run through one captured graph per padded shape."""

    def __init__(self, model, device, max_tokens):
        import torch

        from .host_copy import to_host
        self.torch, self.model, self.device, self.max_tokens = torch, model, device, max_tokens
        self.to_host = to_host
        self.graphs = {}  # (rows, columns) -> Captured
        self.eager_shapes = set()  # shapes whose graphs would pass OUTPUT_BYTES
        self.pool = torch.cuda.graph_pool_handle()
        self.lock = threading.Lock()
        self.failed = False

    def run(self, inputs, eager):
        """Float32 rows of `inputs` (a Pass): through a graph, or `eager(inputs)` above the token
        budget, for a shape beyond OUTPUT_BYTES, or where capture failed."""
        rows, columns = inputs.input_ids.shape
        shape = padded_shape(rows, columns)
        with self.lock:
            if self.failed or shape in self.eager_shapes or shape[0] * shape[1] > self.max_tokens:
                return eager(inputs)
            graph = self.graphs.get(shape) or self._capture(shape)
            if graph is None:
                return eager(inputs)
            return self.to_host(graph.run(pad_pass(inputs, *shape), rows, columns))  # before the next replay

    def _capture(self, shape):
        """The graph of this shape, or None: where its output would pass OUTPUT_BYTES (that shape
        runs eagerly from now on), or where capture fails (no graphs from now on)."""
        try:
            graph = Captured(self.torch, self.model, self.device, shape, self.pool)
        except RuntimeError as error:  # an operation that a graph cannot hold: the model runs eagerly
            log.warning("CUDA graph capture failed for passes of %d x %d (%s); passes run without graphs",
                        *shape, error)
            self.failed = True
            return None
        if self.output_bytes + graph.output_bytes > OUTPUT_BYTES:
            self.eager_shapes.add(shape)
            return None
        self.graphs[shape] = graph
        return graph

    @property
    def output_bytes(self):
        """What the graphs kept so far hold in outputs."""
        return sum(graph.output_bytes for graph in self.graphs.values())


class Captured:
    """One shape's graph, its input tensors (copied into before each replay) and its output."""

    def __init__(self, torch, model, device, shape, pool):
        self.torch, self.names = torch, model.input_names
        self.inputs = [torch.zeros(shape, dtype=torch.int64, device=device) for _ in self.names]
        self.inputs[self.names.index("attention_mask")][:, 0] = 1
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(side):  # lazy set-up (handles, kernel choice) outside the graph
            model(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self.output = model(*self.inputs)
        self.output_bytes = self.output.element_size() * self.output.nelement()

    def run(self, padded, rows, columns):
        """The rows (and columns) of `padded`'s pass that are real: a view of the graph's output,
        which the next replay overwrites."""
        for tensor, name in zip(self.inputs, self.names):
            tensor.copy_(self.torch.from_numpy(getattr(padded, name)))
        self.graph.replay()
        output = self.output[:rows]
        if output.dim() > 2:  # token-level rows: the padding columns go too
            output = output[:, :columns]
        return output
