"""How a strided view is read and written (device/views.py): the plan each geometry gets, and reads and writes
through every plan equal to NumPy's ``as_strided`` over the same storage."""

import random

import jax.numpy as jnp
import numpy as np
import torch

from torchtpu_lab.device import views


def _view_of(t: torch.Tensor) -> views.View:
    return views.View(tuple(t.shape), tuple(t.stride()), t.storage_offset())


def test_a_transposed_reshape_reads_one_block_not_a_gather():
    """Attention's ``view(b, s, h, d).transpose(1, 2)`` over a ``[b, s, h * d]`` storage, and a weight
    gradient's ``[tokens, features]`` seen transposed (its tokens span two base dims): one contiguous block in
    another dim order."""
    base = torch.empty(2, 5, 12)
    heads = base.view(2, 5, 3, 4).transpose(1, 2)  # the base split to [2, 5, 3, 4]: a slice plan's transpose
    key = views.dynamic((2, 5, 12), _view_of(heads))[0]
    assert (key.kind, key.split, key.steps) == ("slice", (2, 5, 3, 4), (1, 1, 1, 1))
    tokens_t = base.view(10, 12).t()
    assert views.dynamic((2, 5, 12), _view_of(tokens_t))[0].kind == "permuted"
    # with a broadcast dim as well (expand of the transposed block)
    expanded = base.view(10, 12).t()[:, None].expand(12, 3, 10)
    assert views.dynamic((2, 5, 12), _view_of(expanded))[0].kind == "permuted"



def test_heads_of_a_fused_projection_slice_a_split_base_not_a_gather():
    """GPT-2's ``c_attn(x).split(hd, 2)`` then ``view(b, s, h, d).transpose(1, 2)``: the view's dims subdivide
    the base's last dim, which the plan splits (the same array, reshaped) so that every view dim maps onto one."""
    base = torch.empty(2, 5, 3 * 12)
    for i in range(3):
        head = base.split(12, 2)[i].view(2, 5, 3, 4).transpose(1, 2)
        key, offset = views.dynamic((2, 5, 36), _view_of(head))
        assert key.kind == "slice" and key.split == (2, 5, 9, 4), key
        assert offset == 12 * i


def _random_view(rng: random.Random, base: torch.Tensor) -> torch.Tensor:
    t = base
    for _ in range(rng.randint(1, 4)):
        choice = rng.choice(["reshape", "transpose", "slice", "expand", "select", "permute"])
        if choice == "reshape" and t.is_contiguous():
            n = t.numel()
            factors = [f for f in range(1, n + 1) if n % f == 0]
            a = rng.choice(factors)
            t = t.view(a, n // a)
        elif choice == "transpose" and t.dim() >= 2:
            i, j = rng.sample(range(t.dim()), 2)
            t = t.transpose(i, j)
        elif choice == "permute" and t.dim() >= 2:
            order = list(range(t.dim()))
            rng.shuffle(order)
            t = t.permute(order)
        elif choice == "slice" and t.dim() >= 1:
            d = rng.randrange(t.dim())
            if t.shape[d] > 1:
                start = rng.randrange(t.shape[d] - 1)
                t = t.narrow(d, start, rng.randint(1, t.shape[d] - start))
        elif choice == "expand" and t.dim() <= 3:
            t = t.unsqueeze(rng.randrange(t.dim() + 1))
            shape = list(t.shape)
            shape[shape.index(1)] = rng.randint(1, 3)
            t = t.expand(shape)
        elif choice == "select" and t.dim() >= 2:
            d = rng.randrange(t.dim())
            t = t.select(d, rng.randrange(t.shape[d]))
    return t


def test_reads_and_writes_of_random_views_equal_numpy():
    rng = random.Random(0)
    kinds = set()
    for _ in range(300):
        shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 4)))
        base = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
        v = _random_view(rng, base)
        view = views.canonical(shape, tuple(v.shape), tuple(v.stride()), v.storage_offset())
        if view is None:
            continue
        key, offset = views.dynamic(shape, view)
        kinds.add(key.kind)
        flat = base.numpy().reshape(-1)
        item = flat.itemsize
        want = np.lib.stride_tricks.as_strided(flat[view.offset:], view.size, [s * item for s in view.stride])
        got = views.read(jnp.asarray(base.numpy()), shape, key, offset)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=str(view))
        # a write of distinct values through a view without broadcast dims (a broadcast write keeps one
        # element per alias, which the slice plans' own tests cover)
        if any(n != 1 and s == 0 for n, s in zip(view.size, view.stride)):
            continue
        value = -1.0 - np.arange(int(np.prod(view.size)), dtype=np.float32).reshape(view.size)
        expected = base.clone()
        expected.as_strided(view.size, view.stride, view.offset).copy_(torch.from_numpy(value))
        written = views.write(jnp.asarray(base.numpy()), shape, key, jnp.asarray(value), offset)
        np.testing.assert_array_equal(np.asarray(written), expected.numpy(), err_msg=str(view))
    assert {"slice", "permuted"} <= kinds, kinds
