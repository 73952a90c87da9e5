"""Fixtures of the layer tests: every test starts from the same torch seed."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
