"""MobileNetV3-Small (torchvision's configuration) with random weights."""

from __future__ import annotations

from typing import NamedTuple

import onnx

from tritonnx.offline.demo_models.graph import FLOAT, GraphBuilder

BN_EPS = 1e-3  # torchvision's MobileNetV3 uses 0.001, not the PyTorch default
# Random weights with fixed BN statistics do not normalise anything, so each BN's gamma is chosen
# to keep activations near the scale He init assumes (the second moment of ReLU(N(0, 1)), 0.5):
# - hardswish keeps only a third of a unit normal's second moment; a wider input restores half;
# - the linear projection that ends a block would hand the next conv twice that, so it is scaled
#   by 1/sqrt(2);
# - a random SE gate sits near hardsigmoid(0) = 0.5, which the projection after it undoes;
# - as in ResNet, residual branches start small so the additions do not compound.
GAMMA: dict[str | None, float] = {"relu": 1.0, "hardswish": 1.2, None: 0.5**0.5}
SE_GAMMA = 2.0
RESIDUAL_GAMMA = 0.2
LAST_CHANNEL = 1024
NUM_CLASSES = 1000


class Block(NamedTuple):
    """One inverted-residual block, as in torchvision's `InvertedResidualConfig`."""

    in_ch: int
    kernel: int
    expanded: int
    out_ch: int
    use_se: bool
    act: str
    stride: int


# torchvision.models.mobilenetv3._mobilenet_v3_conf("mobilenet_v3_small"), width_mult=1.0.
BLOCKS = (
    Block(16, 3, 16, 16, True, "relu", 2),
    Block(16, 3, 72, 24, False, "relu", 2),
    Block(24, 3, 88, 24, False, "relu", 1),
    Block(24, 5, 96, 40, True, "hardswish", 2),
    Block(40, 5, 240, 40, True, "hardswish", 1),
    Block(40, 5, 240, 40, True, "hardswish", 1),
    Block(40, 5, 120, 48, True, "hardswish", 1),
    Block(48, 5, 144, 48, True, "hardswish", 1),
    Block(48, 5, 288, 96, True, "hardswish", 2),
    Block(96, 5, 576, 96, True, "hardswish", 1),
    Block(96, 5, 576, 96, True, "hardswish", 1),
)


def make_divisible(v: float, divisor: int = 8) -> int:
    """Round `v` to a multiple of `divisor` without going more than 10% below it (torchvision)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _conv_bn(
    b: GraphBuilder,
    x: str,
    in_ch: int,
    out_ch: int,
    kernel: int,
    name: str,
    act: str | None,
    stride: int = 1,
    groups: int = 1,
    gamma: float = 1.0,
) -> str:
    """Torchvision's Conv2dNormActivation: conv `name.0`, BN `name.1`, activation."""
    gamma *= GAMMA[act]
    return b.conv_bn(x, in_ch, out_ch, kernel, f"{name}.0", f"{name}.1", stride, groups, act, gamma, BN_EPS)


def _squeeze_excitation(b: GraphBuilder, x: str, channels: int, name: str) -> str:
    squeeze = make_divisible(channels // 4)
    s = b.node("GlobalAveragePool", [x], f"{name}.avgpool")
    s = b.conv(s, channels, squeeze, 1, f"{name}.fc1", bias=True)
    s = b.node("Relu", [s], f"{name}.relu")
    s = b.conv(s, squeeze, channels, 1, f"{name}.fc2", bias=True)
    # torchvision's Hardsigmoid is relu6(x + 3) / 6; ONNX's default alpha is 0.2, not 1/6.
    s = b.node("HardSigmoid", [s], f"{name}.hardsigmoid", alpha=1.0 / 6.0, beta=0.5)
    return b.node("Mul", [x, s], f"{name}.scale")


def _inverted_residual(b: GraphBuilder, x: str, cfg: Block, name: str) -> str:
    y, i = x, 0
    if cfg.expanded != cfg.in_ch:
        y = _conv_bn(b, y, cfg.in_ch, cfg.expanded, 1, f"{name}.{i}", cfg.act)
        i += 1
    channels = cfg.expanded  # depthwise: one group per channel
    y = _conv_bn(b, y, channels, channels, cfg.kernel, f"{name}.{i}", cfg.act, cfg.stride, channels)
    i += 1
    if cfg.use_se:
        y = _squeeze_excitation(b, y, cfg.expanded, f"{name}.{i}")
        i += 1
    residual = cfg.stride == 1 and cfg.in_ch == cfg.out_ch
    gamma = (SE_GAMMA if cfg.use_se else 1.0) * (RESIDUAL_GAMMA if residual else 1.0)
    y = _conv_bn(b, y, cfg.expanded, cfg.out_ch, 1, f"{name}.{i}", None, gamma=gamma)
    return b.node("Add", [y, x], f"{name}.add") if residual else y


def build_mobilenet_v3_small(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV3-Small: `input` FP32 [batch, 3, 224, 224] -> `output` FP32 [batch, 1000]."""
    b = GraphBuilder(seed)
    x = b.add_input("input", FLOAT, ["batch", 3, 224, 224])
    x = _conv_bn(b, x, 3, 16, 3, "features.0", "hardswish", stride=2)
    for n, cfg in enumerate(BLOCKS, start=1):
        x = _inverted_residual(b, x, cfg, f"features.{n}.block")
    last_conv = 6 * BLOCKS[-1].out_ch  # 576
    x = _conv_bn(b, x, BLOCKS[-1].out_ch, last_conv, 1, f"features.{len(BLOCKS) + 1}", "hardswish")
    x = b.global_pool_flatten(x, "avgpool")
    x = b.linear(x, last_conv, LAST_CHANNEL, "classifier.0")
    x = b.node("HardSwish", [x], "classifier.1")
    # classifier.2 is Dropout, an identity at inference.
    x = b.linear(x, LAST_CHANNEL, NUM_CLASSES, "classifier.3")
    b.add_output(x, "output", FLOAT, ["batch", NUM_CLASSES])
    return b.build("mobilenet_v3_small")
