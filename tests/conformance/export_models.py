"""Export the exporters' corpus: models as users get them, `torch.onnx.export` of transformers, torchvision and timm.

Run with the exporters' venv (tests/conformance/requirements-exporters.txt), not the project's: `python
tests/conformance/export_models.py OUT [NAME ...]` writes OUT/<name>/model.onnx, rows.npz (a few rows of each input,
as a user would send them) and expect.json ("batches": its rows are independent; "whole": no dynamic first dim).
Random weights from small local configs (tiny hidden sizes, two layers, a small vocabulary): nothing is downloaded,
and the graphs are the exporters' own, operator for operator, at a fraction of the size.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch  # type: ignore[import-not-found]

OPSET = 17
ROWS = 4
SEQUENCE = 8
VOCAB = 64
Export = tuple[torch.nn.Module, dict[str, np.ndarray], list[str], str]  # module, rows by input, outputs, expect


def _text_rows(names: tuple[str, ...], seed: int, start: int = 2) -> dict[str, np.ndarray]:
    """Token ids (none of them padding), masks with each row's own padding at the end, token types of 0."""
    rng = np.random.default_rng(seed)
    rows = {"input_ids": rng.integers(start, VOCAB, (ROWS, SEQUENCE)).astype(np.int64)}
    lengths = rng.integers(SEQUENCE // 2, SEQUENCE + 1, ROWS)
    rows["attention_mask"] = (np.arange(SEQUENCE)[None, :] < lengths[:, None]).astype(np.int64)
    rows["token_type_ids"] = np.zeros((ROWS, SEQUENCE), np.int64)
    return {name: rows[name] for name in names}


def _normal(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, *shape)).astype(np.float32)


class _Logits(torch.nn.Module):
    """A model whose output is a dict or a ModelOutput, as one named tensor."""

    def __init__(self, model: torch.nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(*args)[self.key]


def bert() -> Export:
    from transformers import BertConfig, BertForSequenceClassification  # type: ignore[import-not-found]

    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=3)  # fmt: skip
    names = ("input_ids", "attention_mask", "token_type_ids")
    return _Logits(BertForSequenceClassification(config), "logits"), _text_rows(names, 1), ["logits"], "batches"


def distilbert() -> Export:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = DistilBertConfig(vocab_size=VOCAB, dim=16, n_layers=2, n_heads=2, hidden_dim=32,
                              max_position_embeddings=32, num_labels=3)  # fmt: skip
    names = ("input_ids", "attention_mask")
    return _Logits(DistilBertForSequenceClassification(config), "logits"), _text_rows(names, 2), ["logits"], "batches"


def roberta() -> Export:
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=40, num_labels=3)  # fmt: skip
    names = ("input_ids", "attention_mask")
    return _Logits(RobertaForSequenceClassification(config), "logits"), _text_rows(names, 3), ["logits"], "batches"


class _Gpt2WithPast(torch.nn.Module):
    """GPT-2 taking and giving its past keys and values as flat tensors, as decoders are exported for serving."""

    def __init__(self, model: torch.nn.Module, layers: int) -> None:
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor) -> tuple:
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        present = out.past_key_values
        flat = []
        for layer in range(self.layers):
            flat += [present.layers[layer].keys, present.layers[layer].values]
        return (out.logits, *flat)


def gpt2_with_past() -> Export:
    from transformers import GPT2Config, GPT2LMHeadModel, masking_utils

    # The causal mask without vmap, which the TorchScript exporter cannot trace (optimum's exporter patches it so).
    masking_utils.sdpa_mask = masking_utils.sdpa_mask_older_torch
    masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["sdpa"] = masking_utils.sdpa_mask_older_torch
    layers, heads, head_dim, past = 2, 2, 8, 3
    config = GPT2Config(vocab_size=VOCAB, n_embd=heads * head_dim, n_layer=layers, n_head=heads, n_positions=64)
    rng = np.random.default_rng(4)
    rows = {  # one decoding step: the exporter bakes the length of the new tokens into the graph
        "input_ids": rng.integers(0, VOCAB, (ROWS, 1)).astype(np.int64),
        "attention_mask": np.ones((ROWS, past + 1), np.int64),
    }
    for layer in range(layers):
        for kind in ("key", "value"):
            rows[f"past_key_values.{layer}.{kind}"] = rng.standard_normal((ROWS, heads, past, head_dim)).astype(
                np.float32
            )
    outputs = ["logits"] + [f"present.{layer}.{kind}" for layer in range(layers) for kind in ("key", "value")]
    return _Gpt2WithPast(GPT2LMHeadModel(config), layers), rows, outputs, "batches"


def t5_encoder() -> Export:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                      relative_attention_num_buckets=8)  # fmt: skip
    names = ("input_ids", "attention_mask")
    return _Logits(T5EncoderModel(config), "last_hidden_state"), _text_rows(names, 5), ["last_hidden_state"], "batches"


def vit() -> Export:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=32, num_labels=5)  # fmt: skip
    return _Logits(ViTForImageClassification(config), "logits"), {"pixel_values": _normal((3, 32, 32), 6)}, ["logits"], "batches"  # fmt: skip


def whisper_encoder() -> Export:
    from transformers import WhisperConfig, WhisperModel

    config = WhisperConfig(vocab_size=VOCAB, d_model=16, encoder_layers=2, encoder_attention_heads=2,
                           decoder_layers=1, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                           num_mel_bins=8, max_source_positions=16, max_target_positions=16, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)  # fmt: skip
    encoder = WhisperModel(config).get_encoder()
    return _Logits(encoder, "last_hidden_state"), {"input_features": _normal((8, 32), 7)}, ["last_hidden_state"], "batches"  # fmt: skip


def wav2vec2() -> Export:
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    config = Wav2Vec2Config(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32, conv_dim=(8, 8), conv_kernel=(10, 3), conv_stride=(5, 2),
                            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2)  # fmt: skip
    return _Logits(Wav2Vec2ForCTC(config), "logits"), {"input_values": _normal((400,), 8)}, ["logits"], "batches"


def _image(make: Callable[[], torch.nn.Module], size: int, seed: int, key: str | None = None) -> Export:
    model = make()
    return (_Logits(model, key) if key else model), {"input": _normal((3, size, size), seed)}, ["output"], "batches"


def torchvision_models() -> dict[str, Callable[[], Export]]:
    from torchvision import models  # type: ignore[import-not-found]
    from torchvision.models import detection, segmentation  # type: ignore[import-not-found]

    def detector(make: Callable[..., torch.nn.Module], seed: int) -> Export:
        model = make(weights=None, weights_backbone=None, num_classes=5)
        image = np.random.default_rng(seed).uniform(0, 1, (ROWS, 3, 64, 64)).astype(np.float32)
        # One image, as torchvision's detectors take a list of images: no batch dim, served whole.
        return _Detector(model), {"image": image}, ["boxes", "scores", "labels"], "whole"

    return {
        "tv_resnet18": lambda: _image(lambda: models.resnet18(num_classes=10), 32, 11),
        "tv_mobilenet_v3_small": lambda: _image(lambda: models.mobilenet_v3_small(num_classes=10), 32, 12),
        "tv_efficientnet_b0": lambda: _image(lambda: models.efficientnet_b0(num_classes=10), 32, 13),
        "tv_vit": lambda: _image(
            lambda: models.VisionTransformer(
                image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=10
            ),
            32,
            14,
        ),  # fmt: skip
        "tv_swin": lambda: _image(
            lambda: models.SwinTransformer(
                patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4], num_classes=10
            ),
            32,
            15,
        ),  # fmt: skip
        "tv_deeplab": lambda: _image(
            lambda: segmentation.deeplabv3_mobilenet_v3_large(
                weights=None, weights_backbone=None, num_classes=4, aux_loss=False
            ),
            64,
            16,
            key="out",
        ),  # fmt: skip
        "tv_ssdlite": lambda: detector(detection.ssdlite320_mobilenet_v3_large, 17),
        "tv_fasterrcnn": lambda: detector(detection.fasterrcnn_mobilenet_v3_large_320_fpn, 18),
    }


class _Detector(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> tuple:
        found = self.model([image])[0]
        return found["boxes"], found["scores"], found["labels"]


def timm_models() -> dict[str, Callable[[], Export]]:
    import timm  # type: ignore[import-not-found]

    return {
        "timm_convnext": lambda: _image(
            lambda: timm.create_model("convnext_atto", pretrained=False, num_classes=10), 32, 21
        ),  # fmt: skip
        "timm_mobilevit": lambda: _image(
            lambda: timm.create_model("mobilevit_xxs", pretrained=False, num_classes=10), 64, 22
        ),  # fmt: skip
    }


def corpus() -> dict[str, Callable[[], Export]]:
    return {
        "hf_bert": bert,
        "hf_distilbert": distilbert,
        "hf_roberta": roberta,
        "hf_gpt2_with_past": gpt2_with_past,
        "hf_t5_encoder": t5_encoder,
        "hf_vit": vit,
        "hf_whisper_encoder": whisper_encoder,
        "hf_wav2vec2": wav2vec2,
        **torchvision_models(),
        **timm_models(),
    }


def export(name: str, build: Callable[[], Export], out: Path) -> None:
    torch.manual_seed(0)
    module, rows, outputs, expect = build()
    module.eval()
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    inputs = list(rows)
    if expect == "whole":
        example = tuple(torch.from_numpy(rows[n][0]) for n in inputs)
        axes: dict[str, dict[int, str]] = {}
        rows = {n: a[0] for n, a in rows.items()}  # one image per request, no batch dim
    else:
        example = tuple(torch.from_numpy(rows[n][:2]) for n in inputs)
        axes = {n: {0: "batch"} for n in inputs + outputs}
        past = "past_key_values.0.key" in rows
        for n in inputs:
            if rows[n].ndim > 1 and n in ("input_ids", "attention_mask", "token_type_ids") and not past:
                axes[n][1] = "sequence"
        if past:  # named as the warm-up reads them: an empty past, then the past and the new token
            axes["attention_mask"][1] = "past_sequence + 1"
            for n in inputs + outputs:
                if n.startswith(("past_key_values.", "present.")):
                    axes[n][2] = "past_sequence" if n.startswith("past") else "past_sequence + 1"
    with torch.no_grad():
        torch.onnx.export(module, example, str(folder / "model.onnx"), input_names=inputs, output_names=outputs,
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)  # fmt: skip
    np.savez(folder / "rows.npz", **rows)
    (folder / "expect.json").write_text(json.dumps({"expect": expect, "outputs": outputs}))


def main(argv: list[str]) -> int:
    out, names = Path(argv[0]), argv[1:]
    # nn.MultiheadAttention's fast path (torchvision's ViT) has no ONNX export: its exportable path, as users get it.
    torch.backends.mha.set_fastpath_enabled(False)
    models = corpus()
    unknown = sorted(set(names) - set(models))
    if unknown:
        print(f"unknown models: {', '.join(unknown)} (known: {', '.join(models)})", file=sys.stderr)
        return 2
    for name in names or list(models):
        export(name, models[name], out)
        print(f"exported {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
