"""The rule's table: one entry per operator (`entry.Operator`), gathered from the modules of each family.

A new operator is one entry in its family's table and a test in tests/unit/test_batch_axis.py.
"""

from __future__ import annotations

from tritonnx.backend.batch_axis.elementwise import DYNAMIC_QUANTIZERS, ELEMENTWISE
from tritonnx.backend.batch_axis.entry import Operator
from tritonnx.backend.batch_axis.indexing import INDEXING
from tritonnx.backend.batch_axis.layers import LAYERS
from tritonnx.backend.batch_axis.linear import LINEAR
from tritonnx.backend.batch_axis.reducing import REDUCING, REDUCTIONS
from tritonnx.backend.batch_axis.shaping import SHAPING

OPERATORS: dict[str, Operator] = {**ELEMENTWISE, **REDUCING, **LAYERS, **LINEAR, **SHAPING, **INDEXING}

__all__ = ["DYNAMIC_QUANTIZERS", "OPERATORS", "REDUCTIONS", "Operator"]
