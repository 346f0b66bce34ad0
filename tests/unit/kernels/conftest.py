"""Kernel tests launch Triton kernels through the interpreter on CPU (see interpreter.py; the root
conftest imported triton and the kernels with it on)."""

import pytest

from tests.unit.kernels.interpreter import interpreting


@pytest.fixture(autouse=True)
def _interpret():
    with interpreting():
        yield
