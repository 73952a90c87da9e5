import pytest
import torch


@pytest.fixture(autouse=True)
def poison_empty():
    """Deterministic mode makes torch.empty & co. return NaN-filled memory, so unwritten buffers show up."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.use_deterministic_algorithms(was)
