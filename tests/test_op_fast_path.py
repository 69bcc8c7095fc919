"""The per-op host path (issue 26): a repeated call's executable found by its flat key (runtime/fast_keys.py),
fused mode's and strict mode's short paths in the executor, and output tensors made by the native core in one
call (csrc/tensor_factory.cpp). Each must give what the general path gives: the same executable, dtypes, values,
geometry and events. Runs in pure-Python mode too (``TORCHTPU_LAB_NATIVE=0``), where the factory tests skip."""

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import native, telemetry
from torchtpu_lab.device import tensor
from torchtpu_lab.device.storage import Storage
from torchtpu_lab.runtime import executor, fast_keys

needs_core = pytest.mark.skipif(native.module() is None, reason=f"no native core: {native.status().describe()}")
MODES = ("debug", "strict", "fused")


@pytest.mark.parametrize("mode", MODES)
def test_numbers_of_each_type_keep_their_own_executable(mode):
    """``1``, ``1.0`` and ``True`` are different templates (different result dtypes): a fast key that confused
    them would reuse the first one's executable and give the wrong dtype."""
    x = torch.arange(6).reshape(2, 3)
    xt = x.to("tpu")
    with torchtpu_lab.eager_mode(mode):
        for _ in range(2):  # the second round is served by the fast keys
            got = [xt + 1, xt + 1.5, xt + True, xt * 2, xt * 2.5, torch.add(xt, xt, alpha=3)]
            want = [x + 1, x + 1.5, x + True, x * 2, x * 2.5, torch.add(x, x, alpha=3)]
            for g, w in zip(got, want):
                assert g.dtype == w.dtype
                torch.testing.assert_close(g.cpu(), w)


@pytest.mark.parametrize("mode", MODES)
def test_views_and_static_arguments_through_the_fast_key(mode):
    """Views (with a moving offset: one executable for every row), lists of ints and keyword arguments."""
    x = torch.randn(4, 5)
    xt = x.to("tpu")
    with torchtpu_lab.eager_mode(mode):
        for _ in range(2):
            rows = [(xt[i] * 2).cpu() for i in range(4)]
            sums = [xt.sum(dim=[0]), xt.sum(dim=[1], keepdim=True), xt.t().sum(0), xt.to(torch.float64)]
            for i, r in enumerate(rows):
                torch.testing.assert_close(r, x[i] * 2)
            for g, w in zip(sums, [x.sum(dim=[0]), x.sum(dim=[1], keepdim=True), x.t().sum(0), x.double()]):
                assert g.shape == w.shape and g.dtype == w.dtype
                torch.testing.assert_close(g.cpu(), w)


def test_every_fast_key_names_the_executable_of_its_template():
    """The fast keys are a second index of :data:`executor.OPS`, never a second cache of their own."""
    a = torch.randn(3, 3).to("tpu")
    with torchtpu_lab.eager_mode("strict"):
        for _ in range(2):
            _ = (a + 1, a * a, a[1] - 2.0, a.sum([0]), a.relu())
    ops = {id(v) for v in executor.OPS.values()}
    fast = fast_keys.EXECUTABLES.values()
    assert fast and all(id(v) in ops for v in fast)


def test_fast_key_declines_what_only_the_general_path_can_describe():
    op = torch.ops.aten.add.Tensor
    a = torch.randn(2).to("tpu")
    positions, names = frozenset({0, 1}), frozenset({"self", "other", "alpha"})
    assert fast_keys.key(id(op), positions, names, True, (a, torch.randn(2)), {}) is None  # a CPU tensor
    assert fast_keys.key(id(op), positions, names, True, ([a, a],), {}) is None  # a tensor list
    assert fast_keys.key(id(op), positions, names, True, (object(),), {}) is None  # anything unknown
    assert fast_keys.key(id(op), positions, names, True, (1, 2), {}) is None  # no tensor: a factory
    key, dyn, device = fast_keys.key(id(op), positions, names, True, (a, 2.5), {"alpha": 2})
    assert float in key and int in key  # dynamic numbers are keyed by their type only
    assert device == 0 and len(dyn) == 3 and dyn[1:] == [2.5, 2]  # numbers in value positions are inputs
    static, _, _ = fast_keys.key(id(op), positions, names, False, (a, 2.5), {})
    assert (float, 2.5) in static  # ... and constants where the lowering takes them static


@pytest.mark.parametrize("mode", ("strict", "fused"))
def test_short_paths_emit_the_op_events_the_general_path_does(mode):
    a = torch.randn(4, 4).to("tpu")
    with torchtpu_lab.eager_mode(mode):
        _ = (a + a) * 2  # first run: compiles / records through the general path
        torchtpu_lab.sync()
        with torchtpu_lab.profile() as prof:
            for _ in range(3):
                _ = (a + a) * 2
            torchtpu_lab.sync()
    ops = [e for e in prof.events if e.kind == "op"]
    assert [e.name for e in ops] == ["aten::add.Tensor", "aten::mul.Tensor"] * 3
    assert prof.summary()["ops"] == 6
    if mode == "strict":
        assert all(e.detail.get("cache_hit") is True for e in ops)
    assert all(e.source is not None and e.source.filename == __file__ for e in ops)


def test_fused_outputs_keep_the_memory_and_graph_bookkeeping():
    a = torch.randn(8, 8).to("tpu")
    base = torch.tpu.memory_allocated()
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(3):
            y = a * 3
        assert isinstance(y.tpu_storage.held, torchtpu_lab.runtime.fused.LazyValue)
        torchtpu_lab.sync()
    # the one live output is counted once computed; the two dropped ones never were
    assert torch.tpu.memory_allocated() == base + 8 * 8 * 4
    torch.testing.assert_close(y.cpu(), a.cpu() * 3)


@needs_core
def test_native_factory_makes_what_the_python_factory_makes():
    storage = Storage((2, 3), torch.float32, 0)
    made = tensor.make(storage, None)
    tensor.use_native_factory(None)
    try:
        reference = tensor.make(storage, None)
    finally:
        tensor.use_native_factory(native.module().new_tensor)
    for t in (made, reference):
        assert type(t) is tensor.TpuTensor and t.tpu_storage is storage and t.tpu_view is None
        assert tensor.storage_ref(t) == (storage, None)
    assert "_tpu_ref" not in made.untyped_storage().__dict__  # the core keeps the pair in C++
    assert reference.untyped_storage()._tpu_ref == (storage, None)
    assert (made.shape, made.stride(), made.dtype, made.device) == \
        (reference.shape, reference.stride(), reference.dtype, reference.device)
    # the core's storage records the tensor's byte size, as a CPU one does; the pure-Python factory's records 0.
    # The core's reports an address that stands for the data model's Storage (tests/test_storage_identity.py),
    # the pure-Python factory's none
    assert made.untyped_storage().nbytes() == 2 * 3 * 4 and reference.untyped_storage().nbytes() == 0
    assert made.data_ptr() != 0 and reference.data_ptr() == 0
    # autograd's saved outputs are shallow copies: plain tensors that adopt() recovers through the storage
    plain = torch.Tensor._make_subclass(torch.Tensor, made)
    assert tensor.adopt(plain).tpu_storage is storage


@needs_core
def test_native_outputs_keep_their_data_with_the_torch_storage_not_on_a_python_object():
    """An op's output makes no Python storage object (with a dict and a tuple): three objects the garbage
    collector tracked per result. The pair lives with the torch storage, where a shallow copy finds it, and an
    in-place geometry change re-points it for the tensor it changed."""
    import gc

    a = torch.randn(4, 6).to("tpu")

    def storage_objects() -> int:
        return sum(1 for o in gc.get_objects() if type(o) is torch.UntypedStorage)

    with torchtpu_lab.eager_mode("fused"):
        before = storage_objects()
        outs = [a * float(i) for i in range(50)]
        assert storage_objects() - before < 5
        torchtpu_lab.sync()
    y = outs[7]
    assert tensor.storage_ref(y) == (y.tpu_storage, None)
    shallow = torch.Tensor._make_subclass(torch.Tensor, y)  # what autograd saves: a plain tensor, same storage
    assert tensor.adopt(shallow).tpu_storage is y.tpu_storage
    y.t_()  # in place: y points at a transposed view of its storage now
    assert tensor.storage_ref(y) == (y.tpu_storage, y.tpu_view) and y.tpu_view is not None
    assert torch.equal(tensor.adopt(torch.Tensor._make_subclass(torch.Tensor, y)).cpu(), (a * 7.0).cpu().t())
    # the Storage lives as long as the torch storage and no longer
    import weakref

    gone = weakref.ref(outs[3].tpu_storage)
    del outs[3]
    gc.collect()
    assert gone() is None


@needs_core
def test_tensor_attributes_are_read_from_the_torch_storage_and_c_lookups_make_no_string():
    """With the core, TpuTensor's ``tpu_storage``/``tpu_view`` are descriptors over the pair kept with the torch
    storage: an op's output carries no attributes (no per-tensor dict), a write re-points the pair, and a tensor
    the pure-Python factory made keeps its pair in its own dict as before. C's char* look-up (what PyTorch's
    argument parser uses for ``__torch_function__`` on every tensor argument) answers as ``getattr`` does."""
    import ctypes

    a = torch.randn(4, 6).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        y = a * 2
        assert y.__dict__ == {}  # nothing written on the object
        assert (y.tpu_storage, y.tpu_view) == tensor.storage_ref(y)
        v = y[1:3]
        assert v.__dict__ == {} and v.tpu_view is not None and v.tpu_storage is y.tpu_storage
        torchtpu_lab.sync()
    assert type(tensor.TpuTensor.__dict__["tpu_storage"]).__name__ == "getset_descriptor"
    # a write re-points the pair (shared with shallow copies), one half at a time
    other = Storage((4, 6), torch.float32, 0)
    z = (a + 1).cpu()
    w = a + 1
    old = w.tpu_storage
    w.tpu_storage = other
    assert tensor.storage_ref(w) == (other, None) and w.tpu_storage is other
    w.tpu_storage = old
    torch.testing.assert_close(w.cpu(), z)
    with pytest.raises(AttributeError, match="cannot be deleted"):
        del w.tpu_storage
    # the pure-Python factory's tensors: the pair in their own dict
    storage = Storage((2, 3), torch.float32, 0)
    tensor.use_native_factory(None)
    try:
        ref = tensor.make(storage, None)
    finally:
        tensor.use_native_factory(native.module().new_tensor)
    assert ref.__dict__ == {"tpu_storage": storage, "tpu_view": None} and ref.tpu_storage is storage
    # C's char* attribute look-up
    get = ctypes.pythonapi.PyObject_GetAttrString
    get.restype, get.argtypes = ctypes.py_object, [ctypes.py_object, ctypes.c_char_p]
    assert get(y, b"__torch_function__") is torch._C._disabled_torch_function_impl
    assert get(y, b"shape") == y.shape and get(y, b"tpu_storage") is y.tpu_storage
    with pytest.raises(AttributeError):
        get(y, b"no_such_attribute")
    assert torch.equal(torch.add(y, y).cpu(), (a * 4).cpu())


@pytest.mark.parametrize("used_first", (True, False))
def test_an_in_place_view_op_leaves_shallow_copies_their_own_geometry(used_first):
    """``.data`` and ``detach()`` alias a tensor (``.data`` through a shallow copy that shares its torch storage).
    An in-place view op on the tensor (``t_``) changes its geometry only: the aliases keep theirs, and still see
    its data, as on the CPU — whether or not an alias took part in an op before the change."""
    results = []
    for device in ("cpu", "tpu"):
        x = torch.arange(6.0).reshape(2, 3).to(device)
        d, y = x.data, x.detach()
        if used_first:
            _ = (d + 1, y + 1)
        x.t_()
        x.add_(10)
        results.append([t.cpu() for t in (x, d, y, d + 0, y * 1)])
    for cpu, tpu in zip(*results):
        assert tpu.shape == cpu.shape
        torch.testing.assert_close(tpu, cpu)


@needs_core
def test_native_factory_rejects_bad_arguments_with_python_errors():
    new = native.module().new_tensor
    storage = Storage((2,), torch.float32, 0)
    with pytest.raises(TypeError):
        new(int, (2,), (1,), torch.float32, 0, storage, None)
    with pytest.raises(TypeError):
        new(tensor.TpuTensor, (2,), (1,), "float32", 0, storage, None)
    with pytest.raises(ValueError):
        new(tensor.TpuTensor, (2, 2), (1,), torch.float32, 0, storage, None)
    with pytest.raises(TypeError):
        new(tensor.TpuTensor, (2,), (1,), torch.float32)
    assert (torch.ones(2, device="tpu") + 1).cpu().tolist() == [2.0, 2.0]  # the session carries on


def test_telemetry_recorders_is_what_the_short_paths_read():
    """The short paths test ``telemetry.recorders`` directly (no call): it must stay the list of open recorders."""
    assert isinstance(telemetry.recorders, list)
    with torchtpu_lab.profile():
        assert telemetry.recorders and telemetry.recording()


@pytest.mark.parametrize("mode", ("strict", "fused"))
def test_op_events_are_batched_while_recording_and_expanded_on_close(mode):
    """The short paths note one record per op (no Event object, no second stack walk) in every open recorder:
    the marker and the fields, flat (the Python path), or a native op log (the recording kernel); closing a
    recorder turns them into the same Events the general path makes, nested recorders included."""
    a = torch.randn(4, 4).to("tpu")
    with torchtpu_lab.eager_mode(mode):
        _ = a + a  # first run: the general path
        torchtpu_lab.sync()
        with telemetry.Recorder() as outer:
            with telemetry.Recorder() as inner:
                y = a + a  # BATCHED_LINE
                batched = list(inner)
            torchtpu_lab.sync()
    logs = tuple(telemetry.OP_LOGS)
    [first] = [e for e in batched if e is telemetry.OP_MARK or type(e) in logs]  # batched while open
    at = next(i for i, e in enumerate(batched) if e is first)
    if first is telemetry.OP_MARK:
        fields = batched[at + 1:]
    else:
        assert at == len(batched) - 1 and len(first) == 1
        fields = first.fields()
    assert fields[0] == "aten::add.Tensor" and len(fields) == telemetry.OP_FIELDS
    for events in (outer, inner):
        assert not any(e is telemetry.OP_MARK for e in events)
        ops = [e for e in events if e.kind == "op"]
        assert [e.name for e in ops] == ["aten::add.Tensor"]
        event = ops[0]
        assert isinstance(event, telemetry.Event) and event.dur >= 0
        assert event.detail == {"cache_hit": True if mode == "strict" else None}
        assert event.source.filename == __file__ and event.source.function == event.stack[-1].function
        assert event.stack[-1] == event.source  # the user's stack ends at the op's own line
    torch.testing.assert_close(y.cpu(), a.cpu() * 2)


def test_fused_op_reads_the_user_line_once_for_node_event_and_storage():
    """Inside a profile (allocation sources on), the graph node, the op event and the output's memory record of
    a fused op name the same line, and it is the user's."""
    a = torch.randn(4, 4).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        _ = a * 3
        torchtpu_lab.sync()
        with torchtpu_lab.profile() as prof:
            y = a * 3
            node_source = y.tpu_storage.held.node.source
            storage_source = y.tpu_storage.source
        ops = [e for e in prof.events if e.kind == "op"]
    assert node_source is storage_source is ops[-1].source
    assert node_source.filename == __file__ and node_source.function.startswith("test_fused_op_reads")


def test_sources_are_interned_and_bounded(monkeypatch):
    first = [telemetry.user_source(1) for _ in range(2)]
    assert first[0] is first[1]  # the same line: one object, built once
    monkeypatch.setattr(telemetry, "_MAX_SOURCES", len(telemetry._sources) + 1)
    telemetry.user_source(1)
    telemetry.user_source(1)  # another line: the table is full, so it starts over rather than grow
    assert len(telemetry._sources) <= telemetry._MAX_SOURCES


def test_equal_code_from_two_files_keeps_each_files_name():
    """CPython's code equality ignores the file name: the same text compiled as two cells is two equal code
    objects, and a table keyed by code objects gave the second cell the first one's name."""
    found = []
    for name in ("<cell-a>", "<cell-b>"):
        ns = {"telemetry": telemetry}
        exec(compile("s = telemetry.user_source(1)\n", name, "exec"), ns)  # noqa: S102 — code made as a cell is
        found.append((ns["s"].filename, ns["s"].lineno))
    assert found == [("<cell-a>", 1), ("<cell-b>", 1)]
