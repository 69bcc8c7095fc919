"""What code that looks for shared memory through ``data_ptr()`` sees of tpu tensors (csrc/tensor_factory.cpp):
an address per storage of the device's data model, shared by its views and by tied parameters, distinct between
tensors that do not share memory, as on CUDA. ``transformers``' ``save_pretrained`` groups weights by it: with one
address for every tensor it took all of them for tied weights and refused to save."""

import pytest
import torch

from torchtpu_lab import native

pytestmark = pytest.mark.skipif(native.module() is None,
                                reason="pure-Python mode: PyTorch's Python factory gives tpu tensors no data pointer")


def test_distinct_tensors_report_distinct_addresses_and_views_their_bases():
    a = torch.ones(3, 4, device="tpu")
    b = torch.ones(3, 4, device="tpu")
    assert len({a.data_ptr(), b.data_ptr(), a.clone().data_ptr(), (a + 0).data_ptr()}) == 4
    assert 0 not in (a.data_ptr(), b.data_ptr())
    row = a[1]
    assert row.data_ptr() - a.data_ptr() == 4 * a.element_size()  # the view's offset, as on CPU
    assert a.t().data_ptr() == a.view(12).data_ptr() == a.data_ptr()
    assert a.untyped_storage().data_ptr() == row.untyped_storage().data_ptr()
    p = torch.nn.Parameter(torch.randn(5, device="tpu"))
    lin = torch.nn.Linear(5, 5).to("tpu")
    assert p.data_ptr() == p.detach().data_ptr() == p.data.data_ptr()
    assert lin.weight.data_ptr() != lin.bias.data_ptr()


def test_a_storage_records_its_byte_size_as_on_cpu():
    """``untyped_storage().nbytes()`` and ``storage().size()`` of a tensor and of its views are the base's, as on
    CPU (they were 0 for a base, so a storage read gave ``[]``)."""
    import warnings

    warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
    for device in ("cpu", "tpu"):
        x = torch.ones(4, 4, device=device)
        views = (x, x[1], x[:2], x.t(), x.view(16), x[1:].narrow(1, 1, 2))
        assert [v.untyped_storage().nbytes() for v in views] == [64] * 6, device
        assert (x + 1).untyped_storage().nbytes() == 64 and x.storage().size() == 16, device
        assert torch.ones(3, dtype=torch.float16, device=device).untyped_storage().nbytes() == 6, device
    # its bytes are the tensor's (a byte view of its data: tests/test_serialization.py)
    assert x.untyped_storage().tolist() == torch.ones(4, 4).untyped_storage().tolist()


def test_an_in_place_op_keeps_the_address_and_a_new_result_gets_its_own():
    x = torch.zeros(8, device="tpu")
    before = x.data_ptr()
    x.add_(1)
    x[2:4].mul_(3)
    assert x.data_ptr() == before
    assert (x * 2).data_ptr() != before


transformers = pytest.importorskip("transformers")


def test_save_pretrained_of_a_model_on_tpu_keeps_its_tied_weights_and_values(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=64, bos_token_id=0,
                                  eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).to("tpu")
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.mul_(3)  # values the device computed, not the CPU init
    model.save_pretrained(tmp_path)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    want = {k: v.cpu() for k, v in model.state_dict().items()}
    got = loaded.state_dict()
    assert set(got) == set(want)
    for k, v in got.items():
        assert torch.equal(v, want[k]), k
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()  # still tied
