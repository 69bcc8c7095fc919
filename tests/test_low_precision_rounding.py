"""Each op's bfloat16/float16 result is rounded to its dtype inside a fused graph, as PyTorch's eager kernels
round it (runtime/compile_cache.py EAGER_OPTIONS). XLA may otherwise keep such values in float32 between the
ops it fuses. PyTorch's test_torch test_copy_ found it: a bfloat16 tensor drawn and copied in one graph compared
unequal to its own copy."""

import pytest
import torch

import torchtpu_lab


@pytest.mark.parametrize("mode", ["fused", "strict"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_chain_of_low_precision_ops_rounds_each_result_as_cpu_does(mode, dtype):
    x = torch.linspace(-7.3, 9.1, 257).to(dtype)
    expected = ((x * 3.1) * x - x * 0.37) / 1.3
    with torchtpu_lab.eager_mode(mode):
        t = x.to("tpu")
        got = ((t * 3.1) * t - t * 0.37) / 1.3
        assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_value_made_in_the_same_graph_equals_itself_times_one(dtype):
    torch.manual_seed(0)
    with torchtpu_lab.eager_mode("fused"):
        x = torch.empty(64, dtype=dtype, device="tpu").uniform_(-9, 9)
        roundtrip = x.to(torch.float32).to(dtype)
        assert (x * 1 != x).sum().item() == 0
        assert torch.equal(roundtrip.cpu(), x.cpu())
