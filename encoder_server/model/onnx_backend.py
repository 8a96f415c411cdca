"""ONNX Runtime backend: runs the exported pooled encoder (see onnx_export and model_cache)."""
import onnxruntime as ort

# How long an idle intra-op thread spins for more work before it sleeps. Within a pass the gaps
# between parallel operators are far shorter; after one, ONNX Runtime's default kept a thread
# spinning for about 40 ms, a core taken from the server's other processes while they carried the
# result and the next request: one-text requests on an idle 2-core server took 1.5-1.9x as long at
# p99, about the same at p50. (A release of ONNX Runtime that does not know the key ignores it.)
SPIN_US = 100


class OnnxBackend:
    def __init__(self, spec, threads=None):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or spec.threads_per_worker
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # planned memory patterns only pay off for repeated shapes; passes vary, and without them a
        # worker held 24 MB less after a mixed workload, at the same speed
        options.enable_mem_pattern = False
        options.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_US))
        providers = ["CUDAExecutionProvider"] if spec.device == "cuda" else []
        self.session = ort.InferenceSession(spec.onnx_file, options,
                                            providers=providers + ["CPUExecutionProvider"])
        self.inputs = [node.name for node in self.session.get_inputs()]  # unused inputs are dropped at export

    def run(self, inputs):
        (result,) = self.session.run(None, {name: getattr(inputs, name) for name in self.inputs})
        return result
