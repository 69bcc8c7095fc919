import os

os.environ.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

import torchtpu_lab  # noqa: E402,F401


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    yield
