"""A small BERT-style (post-LN) transformer encoder, with two heads.

`text_classifier`: masked mean pooling and a 2-way head (one answer per sequence).
`token_classifier`: a 5-way head on every token (one answer per token, as long as the input).
"""

from __future__ import annotations

import numpy as np
import onnx

from tritonnx.offline.demo_models.graph import FLOAT, INT64, GraphBuilder

VOCAB_SIZE = 1000
MAX_POSITIONS = 128
HIDDEN = 64
LAYERS = 2
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
FFN = 128
NUM_LABELS = 2
NUM_TAGS = 5
# Added to the scores of padded keys. Finite on purpose: -inf turns a fully padded row into NaN
# (softmax of all -inf), while exp(-1e9 - max) is exactly 0 in float32, so padding still drops out.
MASK_VALUE = -1e9


def _split_heads(b: GraphBuilder, x: str, perm: list[int], name: str) -> str:
    """[B, S, HIDDEN] -> [B, S, HEADS, HEAD_DIM], then transposed by `perm`."""
    x = b.node("Reshape", [x, b.constant([0, 0, HEADS, HEAD_DIM])], f"{name}.split")
    return b.node("Transpose", [x], f"{name}.transpose", perm=perm)


def _self_attention(b: GraphBuilder, x: str, key_bias: str, name: str) -> str:
    q = _split_heads(b, b.linear(x, HIDDEN, HIDDEN, f"{name}.query"), [0, 2, 1, 3], f"{name}.query")
    k = _split_heads(b, b.linear(x, HIDDEN, HIDDEN, f"{name}.key"), [0, 2, 3, 1], f"{name}.key")
    v = _split_heads(b, b.linear(x, HIDDEN, HIDDEN, f"{name}.value"), [0, 2, 1, 3], f"{name}.value")
    scores = b.node("MatMul", [q, k], f"{name}.scores")  # [B, HEADS, S, S]
    scale = b.constant(1.0 / np.sqrt(HEAD_DIM), np.float32)
    scores = b.node("Mul", [scores, scale], f"{name}.scale")
    scores = b.node("Add", [scores, key_bias], f"{name}.mask")
    probs = b.node("Softmax", [scores], f"{name}.softmax", axis=-1)
    context = b.node("MatMul", [probs, v], f"{name}.context")  # [B, HEADS, S, HEAD_DIM]
    context = b.node("Transpose", [context], f"{name}.merge.transpose", perm=[0, 2, 1, 3])
    context = b.node("Reshape", [context, b.constant([0, 0, HIDDEN])], f"{name}.merge")
    return b.linear(context, HIDDEN, HIDDEN, f"{name}.output")


def _gelu(b: GraphBuilder, x: str, name: str) -> str:
    """Exact GELU, 0.5 * x * (1 + erf(x / sqrt(2))), in the form onnxruntime fuses."""
    y = b.node("Div", [x, b.constant(np.sqrt(2.0), np.float32)], f"{name}.div")
    y = b.node("Erf", [y], f"{name}.erf")
    y = b.node("Add", [y, b.constant(1.0, np.float32)], f"{name}.add")
    y = b.node("Mul", [x, y], f"{name}.mul")
    return b.node("Mul", [y, b.constant(0.5, np.float32)], name)


def _encoder_layer(b: GraphBuilder, x: str, key_bias: str, name: str) -> str:
    attention = _self_attention(b, x, key_bias, f"{name}.attention")
    x = b.node("Add", [x, attention], f"{name}.attention.residual")
    x = b.layer_norm(x, HIDDEN, f"{name}.attention.norm")
    hidden = _gelu(b, b.linear(x, HIDDEN, FFN, f"{name}.intermediate"), f"{name}.gelu")
    ffn = b.linear(hidden, FFN, HIDDEN, f"{name}.ffn.output")
    x = b.node("Add", [x, ffn], f"{name}.ffn.residual")
    return b.layer_norm(x, HIDDEN, f"{name}.ffn.norm")


def _encode(b: GraphBuilder) -> tuple[str, str]:
    """The encoder: final hidden states [batch, sequence, HIDDEN] and the padding mask.

    Inputs `input_ids`, `attention_mask`: INT64 [batch, sequence]; the mask returned is
    [batch, sequence], True where padded.
    """
    ids = b.add_input("input_ids", INT64, ["batch", "sequence"])
    mask = b.add_input("attention_mask", INT64, ["batch", "sequence"])

    # Embeddings: token + learned absolute position (0 .. sequence-1), then LayerNorm.
    # Unit-variance tables; the LayerNorm right after makes their scale irrelevant anyway.
    word_table = b.initializer("embeddings.word", b.normal((VOCAB_SIZE, HIDDEN), 1.0))
    pos_table = b.initializer("embeddings.position", b.normal((MAX_POSITIONS, HIDDEN), 1.0))
    shape = b.node("Shape", [ids], "embeddings.shape")
    length = b.node("Gather", [shape, b.constant(1)], "embeddings.length", axis=0)
    positions = b.node("Range", [b.constant(0), length, b.constant(1)], "embeddings.position_ids")
    words = b.node("Gather", [word_table, ids], "embeddings.word_lookup")  # [B, S, HIDDEN]
    where = b.node("Gather", [pos_table, positions], "embeddings.position_lookup")  # [S, HIDDEN]
    x = b.node("Add", [words, where], "embeddings.sum")
    x = b.layer_norm(x, HIDDEN, "embeddings.norm")

    # Padded keys get MASK_VALUE added to their scores; padded queries are computed but ignored.
    is_pad = b.node("Equal", [mask, b.constant(0)], "mask.is_pad")  # [B, S]
    masked_value = b.constant(MASK_VALUE, np.float32)
    key_bias = b.node("Where", [is_pad, masked_value, b.constant(0.0, np.float32)], "mask.bias")
    key_bias = b.node("Unsqueeze", [key_bias, b.constant([1, 2])], "mask.key_bias")  # [B, 1, 1, S]

    for layer in range(LAYERS):
        x = _encoder_layer(b, x, key_bias, f"encoder.{layer}")
    return x, is_pad


def build_text_classifier(seed: int = 0) -> onnx.ModelProto:
    """Encoder classifier over token ids; padding (attention_mask == 0) never affects the outputs.

    Inputs `input_ids`, `attention_mask`: INT64 [batch, sequence], sequence <= 128.
    Outputs `logits` FP32 [batch, 2] and `embedding` FP32 [batch, 64], the mean of the final
    hidden states over the unpadded positions (all zeros for a fully padded row).
    """
    b = GraphBuilder(seed)
    x, is_pad = _encode(b)

    # Masked mean pooling: sum the unpadded hidden states, divide by their count (at least 1).
    weight = b.node("Cast", [b.node("Not", [is_pad], "pool.is_token")], "pool.weight", to=FLOAT)
    weight3d = b.node("Unsqueeze", [weight, b.constant([2])], "pool.weight3d")  # [B, S, 1]
    masked = b.node("Mul", [x, weight3d], "pool.masked")
    total = b.node("ReduceSum", [masked, b.constant([1])], "pool.sum", keepdims=0)  # [B, HIDDEN]
    count = b.node("ReduceSum", [weight, b.constant([1])], "pool.count", keepdims=1)  # [B, 1]
    count = b.node("Max", [count, b.constant(1.0, np.float32)], "pool.count_clamped")
    embedding = b.node("Div", [total, count], "pool.mean")

    logits = b.linear(embedding, HIDDEN, NUM_LABELS, "classifier")
    b.add_output(logits, "logits", FLOAT, ["batch", NUM_LABELS])
    b.add_output(embedding, "embedding", FLOAT, ["batch", HIDDEN])
    return b.build("text_classifier")


def build_token_classifier(seed: int = 0) -> onnx.ModelProto:
    """Per-token tagger (named-entity style) over the same encoder.

    Inputs as `text_classifier`. Output `token_logits` FP32 [batch, sequence, 5]: its `sequence`
    dim is the input's, so a request padded in a ragged batch gets its own length back. A token's
    logits never depend on padding (padded keys are masked out of attention).
    """
    b = GraphBuilder(seed)
    x, _ = _encode(b)
    token_logits = b.linear(x, HIDDEN, NUM_TAGS, "tagger")
    b.add_output(token_logits, "token_logits", FLOAT, ["batch", "sequence", NUM_TAGS])
    return b.build("token_classifier")
