"""Turns the checks' failures into the one message a learner should read.

- ``NotImplementedError`` from an exercise file: "exercise 03 is not solved yet: ...".
- :class:`harness.ExerciseFailure`: its message, without a Python traceback.
- Anything else (a bug in your code): pytest's usual traceback, which points into it.

Which files are checked: ``DISTKIT_EXERCISES`` = ``stubs`` (default: your files in
``exercises/``), ``solutions``, or a folder of ``NN_topic.py`` files.
"""
from __future__ import annotations

import pytest

import harness


def pytest_configure(config):
    import torch

    torch.set_num_threads(1)  # the checks are tiny; keep the cores for the ranks


def pytest_report_header(config):
    return (f"distkit exercises: checking {harness.exercise_dir()} "
            f"(DISTKIT_EXERCISES=stubs|solutions|<folder>), processes start with "
            f"{harness.start_method()}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except harness.ExerciseFailure as error:
        message = str(error)
    except NotImplementedError as error:
        message = harness.not_solved_message(error)
    # Outside the except block, so the report shows the sentence and no exception chain.
    pytest.fail(message, pytrace=False)
