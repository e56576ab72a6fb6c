"""The tests' one wait: it returns what the condition found, and a timeout fails naming what was awaited."""

import pytest

from tests.helpers import wait_until


def test_wait_until_returns_the_first_truthy_answer():
    answers = iter([None, [], {"ready": True}])
    assert wait_until(lambda: next(answers), 5, "an answer", interval=0) == {"ready": True}


def test_a_timeout_raises_naming_what_was_awaited():
    with pytest.raises(AssertionError, match=r"^the model READY: not within 0.05s$"):
        wait_until(lambda: False, 0.05, "the model READY", interval=0.01)


def test_the_description_may_say_what_was_seen_last():
    seen = []

    def poll() -> bool:
        seen.append("LOADING")
        return False

    with pytest.raises(AssertionError, match=r"^the model READY, not \['LOADING', "):
        wait_until(poll, 0.05, lambda: f"the model READY, not {seen}", interval=0.01)
