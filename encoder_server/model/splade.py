"""A SPLADE model (a sentence-transformers SparseEncoder: a masked-language model, then SpladePooling)
as one torch module: (input_ids, attention_mask) -> [n, vocabulary] float32 weights, each token's MLM
logits through log(1 + relu(x)) (log1p_relu: log1p once more), padding masked out, then the max or
the sum over the tokens. Run directly by the torch backend and exported to ONNX by the onnx backend,
so both compute the same function; the rows are dense here and made sparse after (sparse_encoder)."""
import torch
from transformers import AutoModelForMaskedLM


class SpladeModel(torch.nn.Module):
    input_names = ("input_ids", "attention_mask")

    def __init__(self, model, strategy, activation):
        super().__init__()
        self.model = model  # the torch backend halves it alone for fp16: the pooling stays float32
        self.strategy, self.activation = strategy, activation

    def forward(self, input_ids, attention_mask):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
        return splade_pool(logits, attention_mask, self.strategy, self.activation)


def splade_pool(logits, attention_mask, strategy, activation="relu"):
    """SpladePooling's arithmetic, in its order: logits [n, seq, vocab] times the mask, relu, log1p
    (twice for log1p_relu), then max or sum over seq. Masked tokens give 0, which neither changes."""
    weights = torch.log1p(torch.relu(logits * attention_mask.unsqueeze(-1).to(logits.dtype)))
    if activation == "log1p_relu":
        weights = torch.log1p(weights)
    return weights.amax(dim=1) if strategy == "max" else weights.sum(dim=1)


def load_splade_model(spec, attention=None):
    """The model folder's masked-language model with the spec's SPLADE pooling, in eval mode, on the
    CPU (`attention` as pooled_model.load_pooled_encoder takes it)."""
    model = AutoModelForMaskedLM.from_pretrained(spec.encoder_path, attn_implementation=attention)
    return SpladeModel(model, spec.splade_pooling, spec.splade_activation).eval()
