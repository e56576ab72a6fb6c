"""A fast slice of `make conformance`: ONNX's own test models served and every output checked.

The cases cover what the demo models do not: a first dim that is not a batch dim, every carried
element type, scalars, fixed and data-set zero dims, integer division, data-dependent shapes,
subgraphs, inputs with defaults, and two models Triton cannot carry (refused with the reason).
The whole corpus (about 1,400 models, 15 minutes) runs with `make conformance`; its command is run
here at its smallest.
"""

from __future__ import annotations

import json

from tests.conformance.__main__ import main
from tests.conformance.corpus import Screened, discover, screen
from tests.conformance.serving import REFUSAL_CAUSES, ConformanceRun

SLICE = (
    "node/test_abs",  # [3, 4, 5]: a fixed first dim that is no batch dim
    "node/test_add_uint8",
    "node/test_and2d",  # BOOL
    "node/test_ai_onnx_ml_label_encoder_string_int",  # STRING in
    "node/test_string_split_basic",  # STRING out, shape set by the data
    "node/test_regex_full_match_basic",
    "node/test_isnan_float16",  # FP16 in, BOOL out
    "node/test_max_float16",
    "node/test_bitshift_right_uint8",
    "node/test_clip_default_int8_inbounds",
    "node/test_det_2d",  # a scalar output
    "node/test_blackmanwindow",  # a scalar input
    "node/test_reduce_sum_empty_axes_input_noop",  # an input fixed at [0]
    "node/test_reduce_sum_empty_set",  # an empty output
    "node/test_div_uint8",  # integer division: the warm-up runs in a child first
    "node/test_mod_mixed_sign_int64",
    "node/test_nonzero_example",  # output shape set by the data
    "node/test_gather_elements_0",
    "node/test_if",  # subgraphs
    "node/test_loop11",
    "node/test_sum_one_input",
    "pytorch-converted/test_Conv1d",  # weights listed as inputs: inputs with defaults
    "pytorch-operator/test_operator_chunk",  # several outputs
    "simple/test_expand_shape_model1",
    "node/test_identity_opt",  # refused: an optional type
    "node/test_sequence_insert_at_back",  # refused: a sequence type
)
REFUSED = {"node/test_identity_opt", "node/test_sequence_insert_at_back"}


def test_a_slice_of_the_corpus_is_served_with_the_outputs_onnx_expects(tmp_path):
    cases = [case for case in discover() if case.name in SLICE]
    screened = [s for s in screen(cases) if isinstance(s, Screened)]
    assert sorted(s.case.name for s in screened) == sorted(SLICE), "the slice must be run correctly in-process"

    verdicts = {v.name: v for v in ConformanceRun(screened, tmp_path, chunk_size=16, progress=lambda _: None).run()}

    for name in SLICE:
        verdict = verdicts[name]
        if name in REFUSED:
            assert verdict.phase == "load" and verdict.cause in REFUSAL_CAUSES, (name, verdict.detail)
            assert "not a tensor: Triton carries tensors only" in verdict.detail
        else:
            assert verdict.correct, (name, verdict.phase, verdict.detail)
            assert verdict.identical, f"{name}: served outputs differ from in-process ONNX Runtime's bits"
    assert verdicts["node/test_abs"].max_batch_size == 0


def test_the_command_serves_the_chosen_cases_and_writes_its_report(tmp_path):
    """`make conformance CONFORMANCE_ARGS=...` at its smallest: one case served, one refused, a report written."""
    arguments = ["--corpus", "onnx", "--pattern", "node/test_abs", "--pattern", "node/test_identity_opt"]
    assert main([*arguments, "--output", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert (summary["corpus_cases"], summary["served_correctly"], summary["refused_at_load"]) == (2, 1, 1)
    assert summary["failed"] == 0 and summary["identical_to_in_process"] == 1
    report = (tmp_path / "report.md").read_text()
    for section in ("| **served correctly**", "## Not served correctly, by cause", "## Left out: in-process"):
        assert section in report
