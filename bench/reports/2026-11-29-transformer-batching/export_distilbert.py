"""DistilBERT at its published size (transformers' default config, 66M parameters), random weights, as torch exports it.

Run with the exporters' venv, build/exporters-venv (make conformance CONFORMANCE_ARGS="--corpus exported" makes it):
    build/exporters-venv/bin/python bench/reports/2026-11-29-transformer-batching/export_distilbert.py build/distilbert/model.onnx
"""

import sys

import torch  # type: ignore[import-not-found]
from transformers import DistilBertConfig, DistilBertForSequenceClassification  # type: ignore[import-not-found]

out = sys.argv[1]
torch.manual_seed(0)
model = DistilBertForSequenceClassification(DistilBertConfig(num_labels=2)).eval()
ids = torch.randint(1, 30000, (2, 16))
mask = torch.ones_like(ids)
axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}, "logits": {0: "batch"}}
torch.onnx.export(
    model,
    (ids, mask),
    out,
    input_names=["input_ids", "attention_mask"],
    output_names=["logits"],
    dynamic_axes=axes,
    opset_version=17,
    dynamo=False,
)
print("exported", out)
