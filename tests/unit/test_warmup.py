import os
import signal

import numpy as np

from tritonnx.backend.tensors import TensorSpec
from tritonnx.backend.warmup import WARM_UP_LENGTHS, crash_in_child, warm_up_candidates


def warm_up_feeds(inputs, batched):
    return next(warm_up_candidates(inputs, batched))


def test_warm_up_feeds_ones_of_the_smallest_shape_and_leaves_defaults_alone():
    inputs = (
        TensorSpec("image", np.dtype(np.float32), (3, -1)),
        TensorSpec("flag", np.dtype(np.bool_), ()),
        TensorSpec("text", np.dtype(np.object_), (-1,)),
        TensorSpec("axes", np.dtype(np.int64), (0,)),
        TensorSpec("bias", np.dtype(np.float32), (2,), optional=True),
    )
    feeds = warm_up_feeds(inputs, batched=False)
    assert set(feeds) == {"image", "flag", "text", "axes"}
    assert feeds["image"].shape == (3, 1) and (feeds["image"] == 1).all()
    assert feeds["flag"].shape == () and feeds["flag"]
    assert feeds["text"].tolist() == ["1"]
    assert feeds["axes"].shape == (0,)
    assert warm_up_feeds(inputs[:1], batched=True)["image"].shape == (1, 3, 1)


def test_longer_tries_follow_named_dims_past_caches_and_expressions_of_them():
    inputs = (
        TensorSpec("ids", np.dtype(np.int64), (-1,), ("sequence",)),
        TensorSpec("mask", np.dtype(np.int64), (-1,), ("past_sequence + sequence",)),
        TensorSpec("past", np.dtype(np.float32), (2, -1, 4), (None, "past_sequence", None)),
        TensorSpec("odd", np.dtype(np.float32), (-1,), ("N/A",)),
    )
    tries = [{name: array.shape for name, array in feeds.items()} for feeds in warm_up_candidates(inputs, True)]
    assert tries == [{"ids": (1, n), "mask": (1, n), "past": (1, 2, 0, 4), "odd": (1, n)} for n in WARM_UP_LENGTHS]


def test_a_try_too_large_for_a_warm_up_is_left_out():
    image = TensorSpec("image", np.dtype(np.float32), (3, -1, -1))  # 3 x 512 x 512 is 786,432: kept
    volume = TensorSpec("volume", np.dtype(np.float32), (-1, -1, -1))  # 512^3 is 134 M: not
    assert [f["image"].shape for f in warm_up_candidates((image,), False)] == [(3, n, n) for n in WARM_UP_LENGTHS]
    assert [f["volume"].shape for f in warm_up_candidates((volume,), False)] == [(1, 1, 1), (16, 16, 16)]


def test_a_child_that_dies_is_reported_by_its_signal():
    assert crash_in_child(lambda: os.kill(os.getpid(), signal.SIGFPE), timeout=30) == "was killed by SIGFPE"
    assert crash_in_child(lambda: None, timeout=30) is None
    assert crash_in_child(lambda: 1 / 0, timeout=30) is None  # an exception shows again in-process


def test_a_child_that_hangs_is_killed_at_its_deadline():
    import time

    assert crash_in_child(lambda: time.sleep(30), timeout=0.2) == "did not finish in 0.2s"
