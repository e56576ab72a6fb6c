import os
import signal

import numpy as np

from backend.tensors import TensorSpec
from backend.warmup import crash_in_child, warm_up_feeds


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


def test_a_child_that_dies_is_reported_by_its_signal():
    assert crash_in_child(lambda: os.kill(os.getpid(), signal.SIGFPE), timeout=30) == "was killed by SIGFPE"
    assert crash_in_child(lambda: None, timeout=30) is None
    assert crash_in_child(lambda: 1 / 0, timeout=30) is None  # an exception shows again in-process


def test_a_child_that_hangs_is_killed_at_its_deadline():
    import time

    assert crash_in_child(lambda: time.sleep(30), timeout=0.2) == "did not finish in 0.2s"
