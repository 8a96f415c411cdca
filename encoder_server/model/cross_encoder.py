"""A cross-encoder as one torch module: (input_ids, attention_mask[, token_type_ids]) -> one raw score
(the classification head's logit) per pair. Run directly by the torch backend and exported to ONNX
by the onnx backend, so both compute the same function; the score activation is applied after it
(reranker.rerank_scores), so that a client may ask for raw scores."""
import inspect

import torch
from transformers import AutoModelForSequenceClassification


class ScoringModel(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        # models without segments (ModernBERT and others) take no token_type_ids
        takes_segments = "token_type_ids" in inspect.signature(model.forward).parameters
        self.input_names = ("input_ids", "attention_mask") + (("token_type_ids",) if takes_segments else ())

    def forward(self, *inputs):
        return self.model(**dict(zip(self.input_names, inputs))).logits.float()


def load_scoring_model(spec, attention=None):
    """The model folder's sequence-classification model, in eval mode, on the CPU (`attention` as
    pooled_model.load_pooled_encoder takes it)."""
    model = AutoModelForSequenceClassification.from_pretrained(spec.encoder_path, attn_implementation=attention)
    return ScoringModel(model).eval()
