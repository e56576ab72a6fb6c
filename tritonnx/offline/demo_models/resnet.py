"""ResNet-50 (torchvision layout, v1.5: stride on the 3x3 conv) with random weights."""

from __future__ import annotations

import onnx

from tritonnx.offline.demo_models.graph import FLOAT, GraphBuilder

EXPANSION = 4
# (bottleneck width, number of blocks, stride of the first block) per stage.
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
NUM_CLASSES = 1000
# The last BN of each residual branch starts small so the 16 residual additions of random
# weights keep the activations in range (the "zero-init residual" idea, softened).
RESIDUAL_GAMMA = 0.2


def _bottleneck(b: GraphBuilder, x: str, in_ch: int, width: int, stride: int, name: str) -> str:
    out_ch = width * EXPANSION
    y = b.conv_bn(x, in_ch, width, 1, f"{name}.conv1", f"{name}.bn1")
    y = b.conv_bn(y, width, width, 3, f"{name}.conv2", f"{name}.bn2", stride=stride)
    y = b.conv_bn(y, width, out_ch, 1, f"{name}.conv3", f"{name}.bn3", act=None, gamma=RESIDUAL_GAMMA)
    shortcut = x
    if stride != 1 or in_ch != out_ch:  # projection shortcut
        shortcut = b.conv_bn(x, in_ch, out_ch, 1, f"{name}.downsample.0", f"{name}.downsample.1", stride, act=None)
    y = b.node("Add", [y, shortcut], f"{name}.add")
    return b.node("Relu", [y], f"{name}.relu")


def build_resnet50(seed: int = 0) -> onnx.ModelProto:
    """ResNet-50: `input` FP32 [batch, 3, 224, 224] -> `output` FP32 [batch, 1000] logits."""
    b = GraphBuilder(seed)
    x = b.add_input("input", FLOAT, ["batch", 3, 224, 224])
    x = b.conv_bn(x, 3, 64, 7, "conv1", "bn1", stride=2)
    x = b.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    in_ch = 64
    for stage, (width, blocks, stride) in enumerate(STAGES, start=1):
        for i in range(blocks):
            x = _bottleneck(b, x, in_ch, width, stride if i == 0 else 1, f"layer{stage}.{i}")
            in_ch = width * EXPANSION
    x = b.global_pool_flatten(x, "avgpool")
    x = b.linear(x, in_ch, NUM_CLASSES, "fc")
    b.add_output(x, "output", FLOAT, ["batch", NUM_CLASSES])
    return b.build("resnet50")
