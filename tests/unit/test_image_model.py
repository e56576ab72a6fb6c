"""The pre-processing model's adapter (backend/triton_model.py), with Triton's real auto-complete code and fakes of
the stub's C++ types; tests/integration/test_image_pipeline.py serves it in a real tritonserver."""

import json

import numpy as np

from tests.images import image_file, reference_pixels, truncated


def test_auto_complete_gives_the_bytes_input_and_the_pixels_output(pb_utils):
    from tritonnx.backend.triton_model import ImagePreprocessModel

    written = {"name": "image", "data_type": "TYPE_INVALID", "dims": [], "allow_ragged_batch": True}
    config = pb_utils.ModelConfig(
        json.dumps({"name": "image_preprocess", "max_batch_size": 16, "input": [written], "output": []})
    )
    ImagePreprocessModel.auto_complete_config(config)
    completed = config.as_dict()
    assert [(i["name"], i["data_type"], i["dims"], i["allow_ragged_batch"]) for i in completed["input"]] == [
        ("image", "TYPE_UINT8", [-1], True)
    ]
    assert [(o["name"], o["data_type"], o["dims"]) for o in completed["output"]] == [
        ("pixels", "TYPE_FP32", [3, 224, 224])
    ]


def test_execute_answers_each_request_and_fails_only_the_bad_one(pb_utils):
    from tritonnx.backend.triton_model import ImagePreprocessModel

    model = ImagePreprocessModel()
    model.initialize(
        {"model_config": json.dumps({"name": "image_preprocess"}), "model_instance_name": "image_preprocess_0"}
    )
    files = [image_file(320, 240, seed=1), truncated(image_file(320, 240, seed=2)), image_file(100, 90, "PNG", seed=3)]
    responses = model.execute([pb_utils.InferenceRequest(image=np.frombuffer(f, np.uint8)[None]) for f in files])
    assert [r.error is None for r in responses] == [True, False, True]
    assert responses[1].error.code == pb_utils.TritonError.INVALID_ARG
    assert "the JPEG image cannot be decoded: image file is truncated" in responses[1].error.message()
    for response, data in ((responses[0], files[0]), (responses[2], files[2])):
        pixels = response.outputs()["pixels"]
        assert pixels.shape == (1, 3, 224, 224)
        np.testing.assert_allclose(pixels[0], reference_pixels(data), rtol=0, atol=1e-5)
