"""Tiny random encoders of several architectures, saved by sentence-transformers itself with
different module stacks, for parity tests. Fast (a few seconds) and deterministic."""
from pathlib import Path

from conftest import WORDS, build_tiny_bert

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,!?"
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)


def build_encoder(folder, arch, seed=0):
    """A random `arch` encoder (bert, roberta, distilbert, mpnet) with its tokenizer, in Hugging Face layout."""
    import torch
    import transformers

    folder = Path(folder)
    if arch == "bert":
        return build_tiny_bert(folder, seed, max_positions=64)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if arch == "roberta":
        tokenizer = _byte_level_tokenizer(folder)
        config = transformers.RobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=66, pad_token_id=1,
                                            **SIZES)
        model = transformers.RobertaModel(config, add_pooling_layer=False)
    else:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if arch == "distilbert" else \
            ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        vocab = [*specials, *WORDS, *CHARS, *(f"##{c}" for c in CHARS)]
        (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
        if arch == "distilbert":
            tokenizer = transformers.DistilBertTokenizerFast(vocab=str(folder / "vocab.txt"))
            config = transformers.DistilBertConfig(vocab_size=len(vocab), dim=32, n_layers=2, n_heads=2,
                                                   hidden_dim=37, max_position_embeddings=64)
            model = transformers.DistilBertModel(config)
        else:
            tokenizer = transformers.MPNetTokenizerFast(vocab=str(folder / "vocab.txt"), unk_token="<unk>")
            config = transformers.MPNetConfig(vocab_size=len(vocab), max_position_embeddings=66, pad_token_id=1,
                                              **SIZES)
            model = transformers.MPNetModel(config, add_pooling_layer=False)
    tokenizer.model_max_length = 64
    tokenizer.save_pretrained(folder)
    model.eval().save_pretrained(folder)
    return folder


def _byte_level_tokenizer(folder):
    """A RoBERTa tokenizer with a byte-level alphabet and a few merges, so it splits text into words."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import RobertaTokenizerFast

    alphabet = sorted(ByteLevel.alphabet())
    merges = [("\u0120", word[0]) for word in WORDS[:20]]
    vocab = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", *alphabet, *(a + b for a, b in merges)]
    return RobertaTokenizerFast(vocab={token: i for i, token in enumerate(dict.fromkeys(vocab))}, merges=merges)


def save_sentence_transformer(encoder_folder, target, pooling="mean", dense=None, layer_norm=False,
                              normalize=True, prompts=None, default_prompt_name=None, include_prompt=True,
                              max_seq_length=48, seed=0):
    """The encoder wrapped as sentence-transformers saves it: Transformer, Pooling, then optionally
    Dense(out, activation), LayerNorm and Normalize. Returns the folder."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    torch.manual_seed(seed)
    transformer = models.Transformer(str(encoder_folder), max_seq_length=max_seq_length)
    width = transformer.get_embedding_dimension()
    modules = [transformer, models.Pooling(width, pooling_mode=pooling, include_prompt=include_prompt)]
    if dense is not None:
        out_features, activation = dense
        modules.append(models.Dense(width, out_features, activation_function=activation))
        width = out_features
    if layer_norm:
        modules.append(models.LayerNorm(width))
        with torch.no_grad():  # not the identity it starts as, so a dropped LayerNorm shows
            modules[-1].norm.weight.uniform_(0.5, 1.5)
            modules[-1].norm.bias.uniform_(-0.5, 0.5)
    if normalize:
        modules.append(models.Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", prompts=prompts, default_prompt_name=default_prompt_name)
    model.save(str(target))
    return Path(target)
