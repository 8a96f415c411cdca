"""ONNX Runtime backend: runs the exported pooled encoder (see onnx_export and model_cache)."""
import onnxruntime as ort

from ..arrays import pad_token_axis


class OnnxBackend:
    def __init__(self, settings, threads=None):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or settings.threads_per_worker
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # planned memory patterns only pay off for repeated shapes; passes vary, and without them a
        # worker held 24 MB less after a mixed workload, at the same speed
        options.enable_mem_pattern = False
        providers = ["CUDAExecutionProvider"] if settings.device == "cuda" else []
        self.session = ort.InferenceSession(settings.onnx_file, options,
                                            providers=providers + ["CPUExecutionProvider"])
        self.inputs = [node.name for node in self.session.get_inputs()]  # unused inputs are dropped at export
        self.pad_tokens_to = settings.max_seq_len if settings.pooling.token_level else None

    def run(self, inputs):
        (result,) = self.session.run(None, {name: getattr(inputs, name) for name in self.inputs})
        return pad_token_axis(result, self.pad_tokens_to, axis=1) if self.pad_tokens_to else result
