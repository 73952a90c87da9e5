"""Fixtures of the experiment tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def torch_threads():
    """Training in this process sets torch's thread count (--threads 1); the tests after it get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
