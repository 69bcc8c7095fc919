"""The native core's recording kernel (issue 26; csrc/recorder.cpp, runtime/recording.py): fused eager's repeated
op recorded without entering Python. What it records must be exactly what the Python path records — the same
pending graph (so the same compiled graph), the same user lines, the same values — and everything it does not
cover must still reach the Python path."""

import inspect
import subprocess
import sys

import pytest
import torch

import torchtpu_lab
from compare import twins
from torchtpu_lab import caches, config, native, telemetry
from torchtpu_lab.device import memory
from torchtpu_lab.runtime import fused, recording

pytestmark = pytest.mark.skipif(not recording.available(native.module()),
                                reason=f"no recording kernel: {native.status().describe()}")


def _recorded() -> int:
    return recording.stats()["recorded"]


def _python_path():
    """A block in which the recording kernel hands every call to Python (allocation sources on)."""
    return memory.TRACK_SOURCES(True)


def _step(a, b, w):
    h = torch.tanh(a @ w + b)
    return (h * 0.5 - a).relu().sum(dim=1, keepdim=True)


def test_repeated_ops_are_recorded_in_cpp_and_compute_what_cpu_does():
    a, b, w = torch.randn(4, 8), torch.randn(8), torch.randn(8, 8)
    ta, tb, tw = a.to("tpu"), b.to("tpu"), w.to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        _step(ta, tb, tw)  # the first call of each signature: compiled and learned by the Python path
        _step(ta, tb, tw)
        before = _recorded()
        out = _step(ta, tb, tw)
        recorded = _recorded() - before
        torch.testing.assert_close(out.cpu(), _step(a, b, w))
    assert recorded >= 6, recorded  # mm, add, tanh, mul by a wrapped scalar, sub, relu, sum


def test_both_paths_build_the_same_graph():
    """The pending graph the kernel builds has the key the Python path's has: the graph compiled from a step
    the Python path recorded is a cache hit for the same step recorded by the kernel."""
    a, b, w = (torch.randn(4, 8).to("tpu"), torch.randn(8).to("tpu"), torch.randn(8, 8).to("tpu"))
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        caches.clear_all()
        before = _recorded()
        with _python_path():
            out = _step(a, b, w)
            torchtpu_lab.sync()  # compiles the step's graph from the Python path's recording
        out = _step(a, b, w)  # the kernel keys each call, misses, and the Python path teaches it
        torchtpu_lab.sync()
        assert _recorded() == before
        before, hits = _recorded(), telemetry.counters["graph_cache_hits"]
        out = _step(a, b, w)
        assert _recorded() - before >= 6
        torchtpu_lab.sync()
        assert telemetry.counters["graph_cache_hits"] == hits + 1
        torch.testing.assert_close(out.cpu(), _step(a.cpu(), b.cpu(), w.cpu()))


def test_recorded_nodes_carry_the_users_line():
    a = torch.randn(3, 3).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        for _ in range(3):
            y = torch.exp(a); line = inspect.currentframe().f_lineno
            if _ == 1:
                torchtpu_lab.sync()
                before = _recorded()
        assert _recorded() == before + 1
        node = y.tpu_storage.held.node
        assert node.source is not None and node.source.lineno == line and node.source.filename == __file__
        torch.testing.assert_close(y.cpu(), torch.exp(a.cpu()))


def test_each_call_keeps_its_own_line_and_new_code_never_gets_an_old_codes_line():
    """The kernel remembers a frame's answer by (code object, instruction): two calls in one loop keep their own
    lines, and code compiled anew (a re-run notebook cell; an old code object's address may be reused) gets its
    own file and line once recorded in C++."""
    a = torch.randn(3, 3).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        for _ in range(3):
            x = torch.exp(a); lx = inspect.currentframe().f_lineno
            y = torch.exp(a); ly = inspect.currentframe().f_lineno
        assert (x.tpu_storage.held.node.source.lineno, y.tpu_storage.held.node.source.lineno) == (lx, ly)
        for i in range(8):
            name = f"<cell-{i}>"
            code = compile("\n" * (i % 3) + "out = torch.exp(a)\n", name, "exec")
            for _ in range(2):  # the first run interns the line (Python path), the second is recorded in C++
                ns = {"torch": torch, "a": a}
                before = _recorded()
                exec(code, ns)  # noqa: S102 — code made as a cell is
            assert _recorded() == before + 1
            source = ns["out"].tpu_storage.held.node.source
            assert (source.filename, source.lineno) == (name, i % 3 + 1)
            del code, ns
        torchtpu_lab.sync()


def test_views_are_keyed_by_their_geometry_and_strict_mode_runs_no_recording():
    x = torch.randn(4, 5)
    xt = x.to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for it in range(3):  # each row's offset is its own entry; each is taught once
            rows = [(xt[i] * 2).cpu() for i in range(4)]
            gram = (xt.t() @ xt).cpu()
            if it == 1:
                before = _recorded()
        assert _recorded() == before + 10  # 4 row views (select) and their mul; the transpose view and the mm
    for i, r in enumerate(rows):
        torch.testing.assert_close(r, x[i] * 2)
    torch.testing.assert_close(gram, x.t() @ x)
    with torchtpu_lab.eager_mode("strict"):
        before = _recorded()
        torch.testing.assert_close((xt + xt).cpu(), x + x)
        assert _recorded() == before

@pytest.mark.parametrize("split", [lambda a: a.split(3, dim=1), lambda a: a.split([1, 4, 2], dim=-1),
                                   lambda a: a.unbind(0), lambda a: a.chunk(2, 1)],
                         ids=["split", "split_with_sizes", "unbind", "chunk"])
def test_view_ops_with_a_list_of_outputs_are_served_in_cpp(split):
    """``split``, ``split_with_sizes`` and ``unbind`` (``chunk`` is ``split``) return a list of views: after one
    call taught it each output's geometry, the recording kernel makes them all (a transformer's ``qkv.split``,
    a ViT block's ``qkv.unbind(0)``: ~40 us each in Python). The views alias the input as CPU's do, and
    gradients flow through them."""
    x = torch.randn(3, 7)
    xt = x.to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        split(xt)  # taught by the Python path
        before, handed = _recorded(), recording.stats()["python"]
        parts = split(xt)
        assert _recorded() == before + 1 and recording.stats()["python"] == handed
        want = split(x)
        assert len(parts) == len(want)
        for p, w in zip(parts, want):
            assert tuple(p.shape) == tuple(w.shape) and p.stride() == w.stride()
            torch.testing.assert_close(p.cpu(), w)
        parts[-1].mul_(3)  # a write through one part reaches the input
        want[-1].mul_(3)
        torch.testing.assert_close(xt.cpu(), x)
        g = torch.randn(3, 7, requires_grad=True)
        gt = g.detach().to("tpu").requires_grad_()
        sum(p.sin().sum() * (i + 1) for i, p in enumerate(split(gt))).backward()
        sum(p.sin().sum() * (i + 1) for i, p in enumerate(split(g))).backward()
        torch.testing.assert_close(gt.grad.cpu(), g.grad)


def test_under_a_profile_recorded_ops_keep_their_events_lines_and_stacks():
    xt = torch.randn(4, 5).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):
            xt - xt
        with torchtpu_lab.profile() as prof:
            before = _recorded()
            d = xt - xt; line = inspect.currentframe().f_lineno
            assert _recorded() == before + 1
            torch.testing.assert_close(d.cpu(), torch.zeros(4, 5))
    [event] = [e for e in prof.events if e.kind == "op" and "sub" in e.name]
    assert event.source.lineno == line and event.source.filename == __file__
    assert event.stack and event.stack[-1] == event.source
    assert d.tpu_storage.source == event.source  # a profile tracks allocation sources


def test_a_profile_keeps_recorded_ops_in_native_op_logs_and_reads_them_as_events():
    """The kernel notes a profile's op records in an OpLog at the end of the recorder's list (one object for a
    run of records, not seven fields an op); reading the profile gives each op's event, in order, with the events
    Python recorded (the sync) between the logs' ops, and the op's interval stands for its span at the door."""
    from torchtpu_lab import interrupts

    xt = torch.randn(4, 5).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):
            (xt - xt) * xt
        with torchtpu_lab.profile() as prof:
            [sink] = telemetry.recorders
            before, mark, spans = _recorded(), len(sink), len(interrupts.entry_spans[0])
            for _ in range(3):
                d = (xt - xt) * xt; line = inspect.currentframe().f_lineno
            assert _recorded() == before + 6
            [log] = sink[mark:]  # six records, one object
            assert type(log) is native.module().OpLog and len(log) == 6
            assert len(interrupts.entry_spans[0]) == spans  # no span beside a record
            torchtpu_lab.sync()
            e = xt - xt  # after the sync's events: a new log
            assert type(sink[-1]) is native.module().OpLog and sink[-1] is not log and len(sink[-1]) == 1
    ops = [e for e in prof.events if e.kind == "op"]
    assert [e.name.rsplit("::", 1)[-1] for e in ops[-7:]] == ["sub.Tensor", "mul.Tensor"] * 3 + ["sub.Tensor"], ops
    assert all(e.source.lineno == line and e.source.filename == __file__ for e in ops[-7:-1])
    assert all(e.dur > 0 and e.detail == {"cache_hit": None} and e.stack[-1] == e.source for e in ops[-7:])
    assert [e.t for e in ops] == sorted(e.t for e in ops)
    at = {id(e): i for i, e in enumerate(prof.events)}
    syncs = [i for i, ev in enumerate(prof.events) if ev.kind == "sync"]
    assert any(at[id(ops[-2])] < i < at[id(ops[-1])] for i in syncs)  # the Python event between the two logs
    torch.testing.assert_close(d.cpu(), torch.zeros(4, 5))
    torch.testing.assert_close(e.cpu(), torch.zeros(4, 5))


def test_a_profiled_backward_op_recorded_in_cpp_is_attributed_to_backward():
    """Autograd runs a backward op on its device thread, with no Python frame: its op record's line is
    telemetry.BACKWARD and it has no stack, as the Python path gives them (answered in C++)."""
    w = torch.randn(4, 4).to("tpu").requires_grad_()
    x = torch.randn(2, 4).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(3):
            (x @ w).tanh().sum().backward()
        w.grad = None
        with torchtpu_lab.profile() as prof:
            before = _recorded()
            (x @ w).tanh().sum().backward()
            assert _recorded() - before >= 5
        grad = w.grad
    backward = [e for e in prof.events if e.kind == "op" and e.source is telemetry.BACKWARD]
    assert len(backward) >= 2, [(e.name, e.source) for e in prof.events if e.kind == "op"]  # tanh_backward, mm
    assert all(e.stack is None for e in backward)
    w_c = w.detach().cpu().requires_grad_()
    (x.cpu() @ w_c).tanh().sum().backward()
    torch.testing.assert_close(grad.cpu(), w_c.grad)


def test_wrapped_scalars_are_keyed_by_value():
    x = torch.randn(5)
    xt = x.to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(3):
            outs = [xt * 0.5, xt * 0.25, xt + 3, xt * 0.5]
        for o, w in zip(outs, [x * 0.5, x * 0.25, x + 3, x * 0.5]):
            assert o.dtype == w.dtype
            torch.testing.assert_close(o.cpu(), w)


def test_the_graph_size_limit_still_cuts_graphs():
    a = torch.ones(4).to("tpu")
    with torchtpu_lab.eager_mode("fused"), config.max_graph_ops(16):
        torchtpu_lab.sync()
        y = a
        for _ in range(100):
            y = y + a
            assert fused.pending_ops() <= 16
        torch.testing.assert_close(y.cpu(), torch.full((4,), 101.0))


def test_clearing_the_caches_forgets_the_learned_entries():
    a = torch.randn(3).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):
            torch.sin(a)
        assert recording.stats()["entries"] > 0
        caches.clear_all()
        assert recording.stats()["entries"] == 0
        before = _recorded()
        torch.testing.assert_close(torch.sin(a).cpu(), torch.sin(a.cpu()))
        assert _recorded() == before


def test_an_error_in_a_recorded_graph_still_names_the_op_and_keeps_earlier_tensors():
    a = torch.randn(3, 3).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):
            torch.cos(a)
        kept = (a * 2).cpu()
        y = torch.cos(a)
        torch.testing.assert_close(y.cpu(), torch.cos(a.cpu()))
        torch.testing.assert_close(kept, a.cpu() * 2)


def test_the_switch_sends_every_op_to_the_python_path():
    a = torch.randn(3).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(3):
            torch.tanh(a)
        with config.native_recording(False):
            before = _recorded()
            y = torch.tanh(a)
            assert _recorded() == before
        torch.testing.assert_close(y.cpu(), torch.tanh(a.cpu()))


def test_in_place_updates_are_recorded_and_training_matches_cpu():
    """An optimizer's in-place updates (``add_``, ``mul_``, ``lerp_``, ``addcmul_``, ``addcdiv_``) are recorded
    as their functional op's node written into the parameter's storage; losses and parameters equal CPU's."""
    cpu, tpu = twins(lambda: torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
    x, y = torch.randn(5, 6), torch.randn(5, 1)
    xt, yt = x.to("tpu"), y.to("tpu")
    # the per-parameter path (a foreach step is a node per update kind: test_foreach_ops.py)
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=0.01, foreach=False)
    opt_t = torch.optim.AdamW(tpu.parameters(), lr=0.01, foreach=False)
    recorded = []
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(4):
            for model, opt, a, b in ((cpu, opt_c, x, y), (tpu, opt_t, xt, yt)):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(a), b)
                loss.backward()
                before = _recorded()
                opt.step()
                if model is tpu:
                    recorded.append(_recorded() - before)
                    torch.testing.assert_close(loss.cpu(), loss_c, rtol=1e-5, atol=1e-6)
                else:
                    loss_c = loss.detach()
    assert recorded[-1] >= 4 * 5  # every parameter's five in-place updates, from the third step on
    for p_c, p_t in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(p_t.detach().cpu(), p_c.detach(), rtol=1e-5, atol=1e-6)


def test_under_a_profile_views_are_served_in_cpp_and_timed_at_the_door():
    """A profile times each outermost call into the runtime (its host-overhead figure); a view the kernel knows is
    made in C++ under a profile too, with its span, as the Python view kernel's entry point gives it."""
    from torchtpu_lab import interrupts

    xt = torch.randn(4, 5).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):
            xt.t()
        with torchtpu_lab.profile():
            spans = interrupts.entry_spans[0]
            before, n = _recorded(), len(spans)
            v = xt.t()
            assert _recorded() == before + 1 and len(spans) == n + 2, (spans[n:],)  # flat: start, end
            t0, t1 = spans[-2:]
            assert 0 <= t1 - t0 < 1.0
    torch.testing.assert_close(v.cpu(), xt.cpu().t())


def test_a_recorded_in_place_write_notes_the_old_array_and_keeps_memory_accounting_exact():
    """The C++ write of an in-place op's result (values.set_array's steps: track the storage, note the concrete
    array it held for donation, release it to memory accounting) leaves the same state the Python path does."""
    def scale(t, s):
        t.mul_(s)  # one line: a line the kernel has not seen yet goes to Python once

    with torchtpu_lab.eager_mode("fused"):
        p = torch.full((64, 64), 2.0).to("tpu")
        for _ in range(3):
            scale(p, 0.5)
            torchtpu_lab.sync()
        held, old = memory.allocated(), id(p.tpu_storage.held)
        before = _recorded()
        scale(p, 0.5)
        assert _recorded() == before + 1
        key = id(p.tpu_storage)
        assert fused.PENDING.storages[key]() is p.tpu_storage and fused.PENDING.prior[key] == old
        scale(p, 2.0)  # a second write before the sync: already tracked, the prior array stays noted
        assert _recorded() == before + 2 and fused.PENDING.prior[key] == old
        torchtpu_lab.sync()
        assert memory.allocated() == held  # the old buffer gone (donated), the new one counted
    torch.testing.assert_close(p.cpu(), torch.full((64, 64), 0.25))  # 2 * 0.5**4 * 2


def test_an_absent_optional_tensor_from_a_cpp_caller_is_keyed_as_none():
    """``F.conv2d(x, w)`` reaches ``aten::convolution`` from C++ with an undefined bias tensor, not None (the
    Python kernel sees None either way): the call is recorded in C++ like any other, and computes what CPU does."""
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3)
    xt, wt = x.to("tpu"), w.to("tpu")

    def conv():
        return torch.nn.functional.conv2d(xt, wt, None, 1, 1)  # one line (see test_each_call_keeps_its_own_line)

    with torchtpu_lab.eager_mode("fused"):
        outs = []
        for _ in range(3):
            before = _recorded()
            outs.append(conv())
        assert _recorded() == before + 1
    for out in outs:
        torch.testing.assert_close(out.cpu(), torch.nn.functional.conv2d(x, w, None, 1, 1), rtol=1e-5, atol=1e-5)


def test_in_place_through_a_view_and_bad_dtypes_keep_pytorchs_semantics():
    x = torch.zeros(3, 4)
    xt = x.to("tpu")
    i = torch.ones(3, dtype=torch.int64).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(3):
            xt[0].add_(1)  # a view: written through into the base
            xt.mul_(2)
            with pytest.raises(RuntimeError, match="can't be cast"):
                i.add_(0.5)
    torch.testing.assert_close(xt.cpu(), torch.tensor([[14.0] * 4, [0.0] * 4, [0.0] * 4]))
    torch.testing.assert_close(i.cpu(), torch.ones(3, dtype=torch.int64))


def _whole_view_updates(device: str):
    """A bias gradient as ``sum_to_size`` hands it (``[1, n]`` seen as ``[n]``) updated in place by pointwise ops,
    as gradient clipping's ``_foreach_mul_`` does."""
    base = torch.arange(12.0).reshape(1, 1, 12).to(device)
    grad = base.view(12)
    coef, shift = torch.tensor(0.75).to(device), torch.linspace(0, 1, 12).to(device)
    versions = []
    for _ in range(4):
        torch._foreach_mul_([grad], coef)
        grad.add_(shift, alpha=2.0)
        grad.clamp_(max=20.0)
        grad.mul_(torch.ones(1, 12).to(device)[0])  # an operand that is itself a view
        versions.append(base._version)
    return base, grad, versions


def test_pointwise_updates_of_a_whole_view_are_recorded_on_its_storage_in_cpp():
    with torchtpu_lab.eager_mode("fused"):
        _whole_view_updates("tpu")  # the lessons
        before = recording.stats()["python_ops"]
        base, grad, versions = _whole_view_updates("tpu")
        after = recording.stats()["python_ops"]
        handed = {op: n - before.get(op, 0) for op, n in after.items() if n != before.get(op, 0)}
        assert not any(op.startswith(("aten::mul_", "aten::add_", "aten::clamp_")) for op in handed), handed
        assert grad.shape == (12,) and base.shape == (1, 1, 12) and grad.data_ptr() == base.data_ptr()
        got = base.cpu()
    want, _, cpu_versions = _whole_view_updates("cpu")
    torch.testing.assert_close(got, want)
    assert versions == cpu_versions  # autograd's version counter moves as on the CPU


def _reshaped_gradient_accumulation(device: str):
    """Autograd accumulating two gradients that a ``view``'s backward reshaped (``[batch, seq, d]`` over a linear
    layer's ``[batch * seq, d]``): ``buffer.add_(other)`` where both are the same reshape of a storage alike, then
    a pointwise update with a number; and calls outside that form (another operand of the same shape but not such
    a view, one that broadcasts, a view that is not all of its storage)."""
    base = torch.arange(48.0).reshape(6, 8).to(device)
    buffer = base.view(2, 3, 8)
    others = []
    for k in range(3):
        source = (torch.arange(48.0).reshape(6, 8) * (k + 1)).to(device)
        others.append(source)
        buffer.add_(source.view(2, 3, 8))
        buffer.mul_(0.5)
    buffer.add_(torch.ones(2, 3, 8).to(device))  # a base of self's shape
    buffer.sub_(torch.arange(8.0).to(device))  # broadcast
    base[1:].view(5, 8)[:, :4].add_(1.0)  # not all of its storage
    return base, buffer


def test_an_in_place_update_of_a_reshaped_storage_is_recorded_on_the_storages_in_cpp():
    with torchtpu_lab.eager_mode("fused"):
        _reshaped_gradient_accumulation("tpu")  # the lessons
        before = recording.stats()["python_ops"]
        _reshaped_gradient_accumulation("tpu")
        first = {op: n - before.get(op, 0) for op, n in recording.stats()["python_ops"].items()}
        base, buffer = _reshaped_gradient_accumulation("tpu")
        handed = {op: n - before.get(op, 0) - first.get(op, 0) for op, n in recording.stats()["python_ops"].items()}
        # the accumulations and the scaling in C++; the three calls outside the form, on the Python path
        assert handed.get("aten::mul_.Scalar", 0) == 0, handed
        assert handed.get("aten::add_.Tensor", 0) == 2 and handed.get("aten::sub_.Tensor", 0) == 1, handed
        assert buffer.data_ptr() == base.data_ptr()
        got_base, got_buffer = base.cpu(), buffer.cpu()
    want_base, want_buffer = _reshaped_gradient_accumulation("cpu")
    assert torch.equal(got_base, want_base) and torch.equal(got_buffer, want_buffer)


def test_a_new_value_of_a_dynamic_number_finds_the_same_entry():
    """Numbers the executable takes as graph inputs (a wrapped scalar divisor, ``addcdiv``'s ``value``: an
    optimizer's step size changes every step) are keyed by type, as the Python path's fast key does: a new
    value is recorded in C++ and computes with that value, instead of a new entry per value."""
    x, y, z = torch.randn(8, 8), torch.randn(8, 8), torch.rand(8, 8) + 0.5
    tx, ty, tz = x.to("tpu"), y.to("tpu"), z.to("tpu")
    def update(s):
        return (tx / s).addcdiv(ty, tz, value=-s)

    with torchtpu_lab.eager_mode("fused"):
        for s in (0.5, 0.25):  # the first calls compile and teach
            update(s)
        torchtpu_lab.sync()
        before = recording.stats()
        outs = [(update(s), s) for s in (0.125, 3.0, -7.5)]
        after = recording.stats()
        for out, s in outs:
            torch.testing.assert_close(out.cpu(), (x / s).addcdiv(y, z, value=-s))
    assert after["recorded"] - before["recorded"] == 6, (before, after)
    assert after["learned"] == before["learned"], (before, after)


def test_an_op_with_several_outputs_is_recorded_in_cpp_and_each_output_matches_cpu():
    """Layer norm's output, mean and rstd (and its backward, whose ``output_mask`` is a bool list) are one node
    with three placeholders, recorded in C++; an output a mask leaves out is None, as on the Python path."""
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 5, 16), torch.randn(16), torch.randn(16)
    xt, wt, bt = x.to("tpu"), w.to("tpu"), b.to("tpu")
    ln, lnb = torch.ops.aten.native_layer_norm.default, torch.ops.aten.native_layer_norm_backward.default
    expect = ln(x, [16], w, b, 1e-5)
    g = torch.randn(2, 5, 16)
    gt = g.to("tpu")

    def forward():
        return ln(xt, [16], wt, bt, 1e-5)

    def backward(mask):
        out, mean, rstd = expect
        return lnb(gt, xt, [16], mean.to("tpu"), rstd.to("tpu"), wt, bt, mask)

    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):  # compiled and learned
            forward(), backward([True, True, True])
        before = _recorded()
        outs = forward()
        grads = backward([True, True, True])
        assert _recorded() == before + 2
        partial = [backward([True, False, True]) for _ in range(3)][-1]  # compiled, learned, then recorded
        assert _recorded() == before + 3
    assert isinstance(outs, tuple) and len(outs) == 3
    for got, want in zip(outs, expect):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    want_grads = lnb(g, x, [16], expect[1], expect[2], w, b, [True, True, True])
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    assert partial[1] is None
    torch.testing.assert_close(partial[2].cpu(), want_grads[2], rtol=1e-4, atol=1e-5)


def test_batch_norm_training_in_cpp_matches_cpu_statistics_and_gradients():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    tpu = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    x = torch.randn(4, 3, 8, 8)
    xt = x.to("tpu")

    def step(model, inp):
        model.zero_grad()
        model(inp).square().mean().backward()
        return [p.grad for p in model.parameters()]

    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):
            step(tpu, xt)
            step(cpu, x)
        before = recording.stats()["python_ops"]
        grads = step(tpu, xt)
        torchtpu_lab.sync()
        after = recording.stats()["python_ops"]
    want = step(cpu, x)
    handed = {op: n - before.get(op, 0) for op, n in after.items() if n != before.get(op, 0)}
    # the forward and backward of conv (its bias-only mask: grad_input None) and batch norm: all in C++
    assert not [op for op in handed if "batch_norm" in op or "convolution" in op], handed
    for got, w in zip(grads, want):
        torch.testing.assert_close(got.cpu(), w, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(tpu[1].running_mean.cpu(), cpu[1].running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tpu[1].running_var.cpu(), cpu[1].running_var, rtol=1e-5, atol=1e-6)


def test_a_saved_output_that_autograd_hands_back_as_a_plain_tensor_is_recorded_in_cpp():
    """Autograd gives a backward the op's saved output as a new plain ``torch.Tensor`` every step (relu_'s result
    for threshold_backward, tanh's, log_softmax's): the kernel adopts it as the Python path does, so the backward
    op is recorded in C++ from the third step on, and gradients match CPU."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(inplace=True), torch.nn.Linear(5, 4),
                              torch.nn.Tanh(), torch.nn.LogSoftmax(dim=-1))
    tpu = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(inplace=True), torch.nn.Linear(5, 4),
                              torch.nn.Tanh(), torch.nn.LogSoftmax(dim=-1))
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    x = torch.randn(3, 6)
    xt = x.to("tpu")

    def step(model, inp):
        model.zero_grad()
        model(inp).sum().backward()
        return [p.grad for p in model.parameters()]

    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):
            step(tpu, xt)
        before = recording.stats()["python_ops"]
        grads = step(tpu, xt)
        torchtpu_lab.sync()
        after = recording.stats()["python_ops"]
    handed = {op: n - before.get(op, 0) for op, n in after.items() if n != before.get(op, 0)}
    assert not [op for op in handed if "backward" in op], handed
    for got, want in zip(grads, step(cpu, x)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", ["kernel", "python"])
def test_a_recorded_graph_is_kept_off_the_garbage_collectors_lists_and_freed_at_its_sync(path):
    """A pending graph's nodes, placeholders, input lists and weak references cannot close a reference cycle,
    so they are not tracked by the cyclic collector (tracked, a long graph made every collection walk them and
    brought on full collections); they are still freed by reference counting once the sync ran."""
    import gc
    import weakref

    a = torch.randn(4, 4)
    ta = a.to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        x = ta
        for _ in range(2):  # every call below seen before (from a synced x too): the kernel records them all
            for _ in range(3):
                x = (x + ta).relu() * 0.5
            torchtpu_lab.sync()
        with _python_path() if path == "python" else memory.TRACK_SOURCES(False):
            x, expected = ta, a
            for _ in range(50):
                x = (x + ta).relu() * 0.5
                expected = (expected + a).relu() * 0.5
            nodes = [r() for r in fused.PENDING.segment.refs]
        assert len(nodes) == 150 and all(n is not None for n in nodes)
        held = [x.tpu_storage.held]
        for n in nodes:
            held += [n, *(v for v in n.inputs if type(v) is fused.LazyValue)]
        assert [o for o in held if gc.is_tracked(o)] == []
        # the input lists the kernel makes too; the Python path's stay tracked (one may hold a failed input: an
        # exception and its frames), and the first op after a sync may take that path
        if path == "kernel":
            assert [n.name for n in nodes[1:] if gc.is_tracked(n.inputs)] == []
        assert not any(gc.is_tracked(r) for r in fused.PENDING.segment.refs)
        alive = [weakref.ref(n) for n in nodes]
        del nodes, held, n
        torch.testing.assert_close(x.cpu(), expected)
        del x
        assert all(r() is None for r in alive)


def test_a_concatenation_is_recorded_in_cpp_and_an_append_grows_in_cpp_once_taught():
    """``torch.cat`` of a tensor list (``rotate_half``'s halves, one of them a view) is keyed element by element
    and recorded by the kernel once taught; an append to a growing tensor (runtime/growth.py) makes its padded
    storage in Python, and its first append into spare capacity teaches the kernel, which records the next ones
    at every new length (the length a graph input), each result the front of a padded storage; values are CPU's."""
    from torchtpu_lab.runtime import growth

    x = torch.randn(2, 4, 8)
    tx = x.to("tpu")

    def rotate(t):
        return torch.cat((-t[..., 4:], t[..., :4]), dim=-1)

    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):  # compiled, then taught, by the Python path
            rotate(tx)
        before = recording.stats()
        outs = [rotate(tx) for _ in range(3)]
        after = recording.stats()
        assert after["python_ops"].get("aten::cat", 0) == before["python_ops"].get("aten::cat", 0)
        assert after["recorded"] - before["recorded"] >= 6  # neg and cat, three times
        for out in outs:
            torch.testing.assert_close(out.cpu(), rotate(x))

        seq, cpu_seq = tx[:, :3], x[:, :3]
        handed = []
        for step in range(6):
            piece = torch.full((2, 1, 8), float(step))
            before = recording.stats()["python_ops"].get("aten::cat", 0)
            seq, cpu_seq = torch.cat([seq, piece.to("tpu")], 1), torch.cat([cpu_seq, piece], 1)
            handed.append(recording.stats()["python_ops"].get("aten::cat", 0) - before)
            assert growth.padded_length(seq, 1) == 4 + step
            assert growth.grown_dim(seq.tpu_storage) == 1 and seq.stride() == (seq.tpu_storage.shape[1] * 8, 8, 1)
        assert handed == [1, 1, 0, 0, 0, 0], handed  # the padded storage made, the kernel taught, then C++
        torch.testing.assert_close(seq.cpu(), cpu_seq)


def test_attention_over_padded_keys_is_recorded_in_cpp_once_taught():
    """A decode loop's attention (runtime/padded_attention.py: keys and values grown by appends, no gradient;
    no mask, or one grown with them as a left-padded batch's) goes from the C++ autograd kernel to the recording
    kernel; the Python path teaches its first call on a padded storage, and the next ones, at every new length,
    are recorded in C++ as the same node (the length a graph input), until the storage regrows. Values are CPU's.
    Calls it does not cover — a mask that did not grow with the keys, one that needs a gradient, one under a
    dispatch mode — reach Python as before and compute what CPU does."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from torchtpu_lab.runtime import growth

    name = "aten::scaled_dot_product_attention"
    torch.manual_seed(0)
    width = 256  # 2 KiB a position: capacity 64, doubling
    k_cpu, v_cpu = torch.randn(1, 2, 3, width), torch.randn(1, 2, 3, width)
    keep_cpu = torch.ones(1, 1, 1, 3, dtype=torch.bool)  # a left-padded batch's mask grows with its keys
    with torchtpu_lab.eager_mode("fused"), torch.no_grad():
        k, v, keep = k_cpu.to("tpu"), v_cpu.to("tpu"), keep_cpu.to("tpu")
        handed, capacities, node_keys = {"no mask": [], "mask": []}, [], {}
        for _ in range(64):
            k_new, v_new = torch.randn(1, 2, 1, width), torch.randn(1, 2, 1, width)
            keep_new = torch.rand(1, 1, 1, 1) > 0.3
            k, k_cpu = torch.cat([k, k_new.to("tpu")], 2), torch.cat([k_cpu, k_new], 2)
            v, v_cpu = torch.cat([v, v_new.to("tpu")], 2), torch.cat([v_cpu, v_new], 2)
            keep, keep_cpu = torch.cat([keep, keep_new.to("tpu")], 3), torch.cat([keep_cpu, keep_new], 3)
            q_cpu = torch.randn(1, 2, 1, width)
            q = q_cpu.to("tpu")
            for case, mask, mask_cpu in (("no mask", None, None), ("mask", keep, keep_cpu)):
                before = recording.stats()["python_ops"].get(name, 0)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                handed[case].append(recording.stats()["python_ops"].get(name, 0) - before)
                node_keys.setdefault((case, k.tpu_storage.shape[2]), set()).add(out.tpu_storage.array.node.key)
                torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q_cpu, k_cpu, v_cpu,
                                                                                     attn_mask=mask_cpu))
            assert growth.padded_length(k, 2) == k_cpu.shape[2] == growth.padded_length(keep, 3)
            capacities.append(k.tpu_storage.shape[2])
        regrown = [i for i in range(len(capacities)) if i == 0 or capacities[i] != capacities[i - 1]]
        assert len(regrown) >= 2 and keep.tpu_storage.shape[3] >= capacities[-1], capacities  # a regrowth
        # Python: the first call on each padded storage (which teaches); C++ at every other length
        for case, calls in handed.items():
            assert calls == [int(i in regrown) for i in range(len(calls))], (case, calls, capacities)
        assert all(len(keys) == 1 for keys in node_keys.values()), node_keys

        mask_cpu = torch.rand(1, 1, 1, k_cpu.shape[2]) > 0.3  # not grown with the keys: Python, every call
        before = recording.stats()["python_ops"].get(name, 0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_cpu.to("tpu"))
        assert recording.stats()["python_ops"].get(name, 0) == before + 1
        torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q_cpu, k_cpu, v_cpu, attn_mask=mask_cpu))

        seen = []

        class Names(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(func)
                return func(*args, **(kwargs or {}))

        with Names():
            out = F.scaled_dot_product_attention(q, k, v)
        assert torch.ops.aten.scaled_dot_product_attention.default in seen, seen
        torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q_cpu, k_cpu, v_cpu))

    with torchtpu_lab.eager_mode("fused"):
        q_grad, q_cpu_grad = q.clone().requires_grad_(), q_cpu.clone().requires_grad_()
        F.scaled_dot_product_attention(q_grad, k, v).sum().backward()
        F.scaled_dot_product_attention(q_cpu_grad, k_cpu, v_cpu).sum().backward()
        torch.testing.assert_close(q_grad.grad.cpu(), q_cpu_grad.grad)


def test_attention_over_whole_buffers_is_recorded_in_cpp_once_taught():
    """A static cache's attention (keys and values whole buffers written in place, a mask read at their size)
    is taught by its first call and recorded in C++ after it, as the node the Python path records: the same key
    (its matmul precision in it) and values equal CPU's. A query that is a view, a new precision and a new
    geometry are new keys: their first call takes Python, once."""
    import torch.nn.functional as F

    name = "aten::scaled_dot_product_attention"
    torch.manual_seed(0)
    k_cpu, v_cpu = torch.zeros(1, 2, 16, 32), torch.zeros(1, 2, 16, 32)
    precision = torch.get_float32_matmul_precision()
    try:
        with torchtpu_lab.eager_mode("fused"), torch.no_grad():
            k, v = k_cpu.to("tpu"), v_cpu.to("tpu")
            handed, node_keys = [], []
            for step in range(8):
                if step == 6:
                    torch.set_float32_matmul_precision("high")
                position = torch.tensor([step])
                k_new, v_new, q_cpu = torch.randn(1, 2, 1, 32), torch.randn(1, 2, 1, 32), torch.randn(1, 2, 3, 32)
                k.index_copy_(2, position.to("tpu"), k_new.to("tpu"))
                v.index_copy_(2, position.to("tpu"), v_new.to("tpu"))
                k_cpu.index_copy_(2, position, k_new)
                v_cpu.index_copy_(2, position, v_new)
                mask_cpu = (torch.arange(16) <= step).view(1, 1, 1, 16)
                q, mask = q_cpu.to("tpu"), mask_cpu.to("tpu")
                for query, query_cpu in ((q, q_cpu), (q[:, :, 1:], q_cpu[:, :, 1:])):
                    before = recording.stats()["python_ops"].get(name, 0)
                    out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask)
                    handed.append(recording.stats()["python_ops"].get(name, 0) - before)
                    node_keys.append(out.tpu_storage.array.node.key)
                    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(query_cpu, k_cpu, v_cpu,
                                                                                         attn_mask=mask_cpu))
            # Python: each query geometry's first call, and again at the new precision; C++ otherwise
            assert handed == [1, 1] + [0, 0] * 5 + [1, 1] + [0, 0], handed
            assert [key.precision for key in node_keys] == [precision] * 12 + ["high"] * 4
            assert len(set(node_keys[0:12:2])) == len(set(node_keys[1:12:2])) == 1 and node_keys[0] != node_keys[1]
            with _python_path():  # the node the Python path records for the same call
                out = F.scaled_dot_product_attention(q[:, :, 1:], k, v, attn_mask=mask)
            assert out.tpu_storage.array.node.key == node_keys[-1]
            torchtpu_lab.sync()
    finally:
        torch.set_float32_matmul_precision(precision)


@pytest.mark.parametrize("rows", [1, 3])
def test_appends_recorded_in_cpp_outgrow_their_capacity_and_keep_one_lineage(rows):
    """Appends the kernel records run into the end of their padded storage: the one that does not fit takes
    growth.py's path (a new buffer of twice the capacity), the kernel then records into that one; values, the
    lineage a profile counts tokens by and the length factories read equal the Python path's all along."""
    from torchtpu_lab.runtime import growth

    width = 512  # 2 KiB a position: capacity 64, doubling
    handed = recording.stats()["python_ops"].get("aten::cat", 0)
    with torchtpu_lab.eager_mode("fused"):
        cpu_seq = torch.randn(1, 5, width)
        seq = cpu_seq.to("tpu")
        lineages, capacities = set(), []
        for step in range(70):
            piece = torch.full((1, rows, width), float(step))
            seq, cpu_seq = torch.cat([seq, piece.to("tpu")], 1), torch.cat([cpu_seq, piece], 1)
            lineages.add(growth._GROWN_IDS[id(seq.tpu_storage)][2])
            capacities.append(seq.tpu_storage.shape[1])
            assert growth.padded_length(seq, 1) == cpu_seq.shape[1]
            assert growth.recent_capacity(cpu_seq.shape[1]) == capacities[-1]
            if step % 16 == 0:
                torchtpu_lab.sync()
        with torchtpu_lab.eager_mode("strict"):  # right after an append in C++: other ops still teach the kernel
            ran = recording.stats()["ran"]
            for _ in range(3):
                y = seq * 3.0 + rows
            assert recording.stats()["ran"] > ran
            torch.testing.assert_close(y.cpu(), cpu_seq * 3.0 + rows)
        assert len(lineages) == 1, lineages
        assert capacities[0] == 64 and len(set(capacities)) == 2 and capacities == sorted(capacities), capacities
        torch.testing.assert_close(seq.cpu(), cpu_seq)
    # Python: the first append (the padded storage), each regrowth, and the append after each, which teaches
    assert 0 < recording.stats()["python_ops"].get("aten::cat", 0) - handed <= 4 + 2 * (rows == 3)


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_factories_are_served_in_cpp_joining_pending_work_or_running_now(mode):
    """``torch.full`` / ``arange`` / ``zeros`` / ``ones`` on the tpu device (masks, positions: a decode step makes
    three) are keyed by their device argument: with work pending for that device they join its graph, with none
    (or in strict mode) their executable runs now, both without their Python kernel once taught; a bare
    ``"tpu"`` means the current device; values and dtypes are CPU's, a new fill value included."""
    x = torch.randn(3, 4)
    tx = x.to("tpu")

    def step(fill, pending):
        y = tx * 2 if pending else None
        made = (torch.full((3, 4), fill, device="tpu"), torch.arange(4, device="tpu:0"),
                torch.zeros(2, 3, device="tpu"), torch.ones(2, dtype=torch.int64, device="tpu"))
        if y is not None:
            made = (made[0] + y, *made[1:])
        return made

    with torchtpu_lab.eager_mode(mode):
        for pending in ((True, False) if mode == "fused" else (False,)):
            torchtpu_lab.sync()
            for fill in (0.5, 1.5):  # compiled, then taught
                step(fill, pending)
                torchtpu_lab.sync()
            before = recording.stats()
            for fill in (2.5, -1.0, 3.0):
                full, arange, zeros, ones = step(fill, pending)
                if pending:
                    assert fused.has_pending()
                expected = torch.full((3, 4), fill) + (x * 2 if pending else 0)
                torch.testing.assert_close(full.cpu(), expected)
                assert arange.cpu().tolist() == [0, 1, 2, 3] and arange.dtype == torch.int64
                assert zeros.cpu().tolist() == [[0.0] * 3] * 2 and zeros.dtype == torch.float32
                assert ones.cpu().tolist() == [1, 1] and ones.dtype == torch.int64
                torchtpu_lab.sync()
            after = recording.stats()
            for op in ("aten::full", "aten::arange", "aten::zeros", "aten::ones"):
                assert after["python_ops"].get(op, 0) == before["python_ops"].get(op, 0), (op, pending)
            assert after["recorded" if pending else "ran"] - before["recorded" if pending else "ran"] >= 6


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_casts_on_the_device_are_served_in_cpp_and_transfers_never_are(mode):
    """``x.float()``, ``x.to(torch.bfloat16)``, ``logits.to(copy=True, dtype=...)`` (generate's per-token copy) are
    ``_to_copy`` on the tensor's own device: once taught, the recording kernel serves them (fused: joining the
    graph; strict: running now) with CPU's values and dtypes. A call naming the CPU is a transfer: never keyed,
    always the Python kernel."""
    x = torch.randn(3, 4)
    i = torch.arange(6).reshape(2, 3)
    tx, ti = x.to("tpu"), i.to("tpu")

    def casts():
        return (tx.to(torch.float64), ti.float(), tx.to(copy=True, dtype=torch.float32, device="tpu:0"),
                tx.to("tpu", torch.bfloat16), tx.to("cpu"))

    with torchtpu_lab.eager_mode(mode):
        for _ in range(2):  # compiled, then taught
            casts()
            torchtpu_lab.sync()
        served = "recorded" if mode == "fused" else "ran"
        for _ in range(3):
            before = recording.stats()
            double, floats, copy, bf16, host = casts()
            after = recording.stats()
            assert after[served] - before[served] == 4
            # only the transfer to the CPU reached the Python kernel
            assert after["python_ops"]["aten::_to_copy"] - before["python_ops"]["aten::_to_copy"] == 1
            if mode == "fused":
                assert fused.has_pending()
            assert double.dtype == torch.float64 and double.device == torch.device("tpu:0")
            torch.testing.assert_close(double.cpu(), x.double())
            assert floats.dtype == torch.float32 and floats.cpu().tolist() == i.float().tolist()
            torch.testing.assert_close(copy.cpu(), x)
            assert bf16.dtype == torch.bfloat16 and torch.equal(bf16.cpu(), x.bfloat16())
            assert host.device.type == "cpu" and torch.equal(host, x)


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_host_copies_are_made_without_the_python_kernel(mode):
    """A CPU tensor's copy to a tpu device (``x.to("tpu")``, ``torch.tensor(data, device="tpu")``: a batch moved
    each step, a ``DynamicCache``'s empty start per layer) is made by the recording kernel calling the host copy
    itself: no Python kernel, the values, dtypes and device asked for, the bytes counted, and no aliasing of the
    user's memory. While a profile records (it times the runtime's door), the Python kernel makes it."""
    x = torch.randn(3, 4)
    ints = torch.arange(6).reshape(2, 3)

    def copies():
        return {"plain": (x.to("tpu"), x), "transposed": (x.t().to("tpu"), x.t()),
                "cast": (ints.to("tpu", torch.float32), ints.float()), "bf16": (x.bfloat16().to("tpu"), x.bfloat16()),
                "bool": ((x > 0).to("tpu"), x > 0), "empty": (torch.tensor([], device="tpu"), torch.tensor([])),
                "scalar": (torch.tensor(2.5, device="tpu"), torch.tensor(2.5))}

    def handed() -> int:
        return recording.stats()["python_ops"].get("aten::_to_copy", 0)

    with torchtpu_lab.eager_mode(mode):
        before, sent = handed(), telemetry.counters["transfer_to_device_bytes"]
        made = copies()
        assert handed() == before, handed() - before
        assert telemetry.counters["transfer_to_device_bytes"] - sent >= sum(w.numel() * w.element_size()
                                                                             for _, w in made.values())
        for name, (got, want) in made.items():
            assert got.device == torch.device("tpu:0"), name
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(got.cpu(), want), name
        source = torch.zeros(4)
        copy = source.to("tpu")
        source += 1  # the device copy is the values at the time of the copy
        assert torch.equal(copy.cpu(), torch.zeros(4))

        before = handed()
        with torchtpu_lab.profile():
            profiled = x.to("tpu")
        assert handed() == before + 1 and torch.equal(profiled.cpu(), x)


def test_a_copy_to_another_tpu_device_is_never_served_as_a_cast():
    """``x.to("tpu:1")`` from tpu:0 (or a bare ``"tpu"`` while tpu:1 is current) is a transfer, however often it
    repeats and whatever is pending: each result is on the device asked for, with the values and dtype asked for.
    So is a host copy to tpu:1, named or current."""
    code = r"""
import os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
os.environ["TORCHTPU_LAB_PLATFORM"] = "cpu"
import torch, torchtpu_lab
x = torch.randn(3, 4)
a = x.to("tpu:0")
for mode in ("fused", "strict"):
    with torchtpu_lab.eager_mode(mode):
        for step in range(4):
            pending = a * 1  # work pending on tpu:0 in fused mode
            moved = (a.to("tpu:1"), a.to("tpu:1", torch.float64), pending.to(copy=True, device="tpu:1"))
            with torch.tpu.device(1):
                moved += (a.to("tpu"), a.to("tpu", torch.bfloat16))
            for m in moved:
                assert m.device == torch.device("tpu:1"), (mode, step, m.device)
                torch.testing.assert_close(m.cpu(), x.to(m.dtype))
                assert {d.id for d in m.tpu_storage.array.devices()} == {1}, (mode, step)
            hosted = (x.to("tpu:1"), x.to("tpu:1", torch.float64))  # host copies (made in C++ with the core)
            with torch.tpu.device(1):
                hosted += (torch.tensor([1.0, 2.0], device="tpu"),)
            for h, want in zip(hosted, (x, x.double(), torch.tensor([1.0, 2.0]))):
                assert h.device == torch.device("tpu:1") and torch.equal(h.cpu(), want), (mode, step, h.device)
                assert {d.id for d in h.tpu_storage.array.devices()} == {1}, (mode, step)
            back = moved[0].to("tpu:0", torch.float64)
            assert back.device == torch.device("tpu:0") and torch.equal(back.cpu(), x.double())
            torchtpu_lab.sync()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout


def _checked_ops(table, ids, logits, target, buf, rows, src):
    """Ops whose lowerings report a data-dependent error (an index bound): one output, several, in place."""
    emb = torch.nn.functional.embedding(ids, table)
    loss = torch.nn.functional.cross_entropy(logits, target)  # nll_loss_forward: output and total weight
    buf.index_copy_(0, rows, src)
    return emb, loss


def test_ops_with_checks_are_recorded_in_cpp_and_a_bad_index_still_raises_naming_the_op_and_line():
    """An op whose lowering checks an index (embedding, nll_loss, index_copy_) is recorded by the kernel with its
    error flags as extra outputs of its node: a bad index seen by the C++ path raises what the Python path
    raises — PyTorch's error class and message, the op and the user's line — and leaves the session usable."""
    table, logits = torch.randn(10, 4), torch.randn(3, 5)
    ids, target, rows = torch.tensor([[1, 2, 9]]), torch.tensor([0, 4, 2]), torch.tensor([2, 0])
    buf, src = torch.zeros(4, 3), torch.randn(2, 3)
    t = [x.to("tpu") for x in (table, ids, logits, target, buf, rows, src)]
    expected = _checked_ops(table, ids, logits, target, buf, rows, src)
    line = inspect.getsourcelines(_checked_ops)[1] + 2
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):  # the first call of each signature takes the Python path and teaches the kernel
            _checked_ops(t[0], t[1], t[2], t[3], t[4], t[5], t[6])
        torchtpu_lab.sync()
        stats = recording.stats()
        tpu_buf = torch.zeros(4, 3).to("tpu")
        emb, loss = _checked_ops(t[0], t[1], t[2], t[3], tpu_buf, t[5], t[6])
        after = recording.stats()
        assert after["recorded"] - stats["recorded"] >= 4, after  # the three, and log_softmax
        for op in ("aten::embedding", "aten::nll_loss_forward", "aten::index_copy_"):
            assert after["python_ops"].get(op, 0) == stats["python_ops"].get(op, 0), (op, after["python_ops"])
        torch.testing.assert_close(emb.cpu(), expected[0])
        torch.testing.assert_close(loss.cpu(), expected[1])
        torch.testing.assert_close(tpu_buf.cpu(), buf)

        bad_ids = torch.tensor([[1, 12, 3]]).to("tpu")
        stats = recording.stats()
        emb, _ = _checked_ops(t[0], bad_ids, t[2], t[3], tpu_buf, t[5], t[6])
        assert recording.stats()["python"] == stats["python"]  # the bad call itself went through C++
        with pytest.raises(IndexError, match=rf"aten::embedding: index out of range in self \(at "
                                             rf"test_recording_kernel.py:{line}\)"):
            emb.sum().item()
        bad_target = torch.tensor([0, 7, 2]).to("tpu")
        _, loss = _checked_ops(t[0], t[1], t[2], bad_target, tpu_buf, t[5], t[6])
        with pytest.raises(IndexError, match=r"aten::nll_loss_forward: Target 7 is out of bounds"):
            loss.item()
        emb, loss = _checked_ops(*t)  # the session and earlier tensors still work
        torch.testing.assert_close(emb.cpu(), expected[0])
        torch.testing.assert_close(t[0].cpu(), table)


def test_the_native_sync_snapshot_is_the_python_one():
    """A sync's snapshot of the pending work — the live storages holding placeholders, those placeholders, and
    the placeholders to compute (with an op's error flags, each once, in recording order) — is the same list of
    the same objects from the core's one C pass as from the Python path's."""
    from torchtpu_lab.device.storage import holding

    table, ids = torch.randn(10, 4).to("tpu"), torch.tensor([[1, 2, 3]]).to("tpu")
    x = torch.randn(4, 4).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        kept = []
        for _ in range(3):
            emb = torch.nn.functional.embedding(ids, table)  # error flags: extra values to compute
            y = (x @ x).relu()
            _dropped = y + 1  # noqa: F841 — a storage that dies before the sync
            kept += [emb, y, y.t(), x.add_(1)]  # a view and an in-place write share storages
            del _dropped
        pending = fused.PENDING
        assert pending.extra and pending.storages
        storages, held = holding(pending.storages.values(), fused.LazyValue)
        targets = fused._targets(held, list(pending.extra))
        native_storages, native_held, native_targets = fused.SNAPSHOT[0]()
        assert [id(s) for s in native_storages] == [id(s) for s in storages]
        assert [id(v) for v in native_held] == [id(v) for v in held]
        assert [id(v) for v in native_targets] == [id(v) for v in targets]
        assert len(targets) > len(set(map(id, held))) > 0  # flags beyond the storages' placeholders
        torchtpu_lab.sync()
        assert all(type(s.array) is not fused.LazyValue for s in storages)


def test_a_profiled_append_recorded_in_cpp_has_the_python_paths_op_event():
    """Under a profile an append the kernel records emits the op event growth._append emits (what the generation
    line counts tokens by): the same name, dim, length, piece and lineage, the user's line and stack."""

    def grow(seq, native: bool):
        with torchtpu_lab.config.native_recording(native), torchtpu_lab.profile() as prof:
            handed = recording.stats()["python_ops"].get("aten::cat", 0)
            for _ in range(3):
                seq = torch.cat([seq, torch.ones(1, 1, 8, device="tpu")], 1)  # the append's line
            handed = recording.stats()["python_ops"].get("aten::cat", 0) - handed
            torchtpu_lab.sync()
        events = [e for e in prof.events if e.kind == "op" and e.name == "aten::cat (append)"]
        return seq, events, handed

    with torchtpu_lab.eager_mode("fused"):
        seq = torch.zeros(1, 4, 8, device="tpu")
        for _ in range(3):  # the padded storage, then the lesson
            seq = torch.cat([seq, torch.ones(1, 1, 8, device="tpu")], 1)
        seq, python_events, _ = grow(seq, False)
        seq, native_events, handed = grow(seq, True)
    assert handed == 0 and len(native_events) == len(python_events) == 3
    for p, n in zip(python_events, native_events):
        assert n.detail == {**p.detail, "length": p.detail["length"] + 3}, (p.detail, n.detail)
        assert n.source == p.source and "the append's line" in telemetry.code_text(n.source, 200)
        assert len(n.stack) == len(p.stack) and n.stack[-1] == p.stack[-1] == n.source  # (grow's callers differ)
    torch.testing.assert_close(seq.cpu(), torch.cat([torch.zeros(1, 4, 8), torch.ones(1, 9, 8)], 1))


def test_pointwise_ops_on_fronts_are_recorded_in_cpp_once_taught():
    """A left-padded batch's decode step rebuilds its mask from the grown ``[batch, n]`` attention mask with
    pointwise ops — a cast naming the device, compares, ``&`` — which runtime/bounded.py runs on the padded
    extents (its result the front of the padded output, so the next op is rewritten too). The recording kernel
    records them as that rewrite does, once the rewrite's inner call on the whole extents taught it: at every
    length, the same node, until a storage regrows. Values are CPU's, the results are fronts, a profile sees the
    op; a call whose operands are not aligned along the grown dim takes the Python path, as before."""
    from torchtpu_lab.runtime import bounded, growth

    names = ["aten::mul.Tensor", "aten::add.Tensor", "aten::gt.Scalar", "aten::bitwise_and.Tensor",
             "aten::_to_copy"]

    def handed():
        ops = recording.stats()["python_ops"]
        return {name: ops.get(name, 0) for name in names}

    def ops(x, m):
        y = x * 2.0 + 1.0
        z = m[:, :, None] & (y > 0)
        w = m.to(device=x.device, dtype=torch.float32)
        return y, z, w

    torch.manual_seed(0)
    x_cpu, m_cpu = torch.randn(2, 3, 32), torch.ones(2, 3, dtype=torch.bool)  # 256 bytes a position: capacity 64
    with torchtpu_lab.eager_mode("fused"), torch.no_grad():
        x, m = x_cpu.to("tpu"), m_cpu.to("tpu")
        calls, capacities, node_keys = [], [], {}
        for _ in range(70):
            x_new, m_new = torch.randn(2, 1, 32), torch.rand(2, 1) > 0.3
            x, x_cpu = torch.cat([x, x_new.to("tpu")], 1), torch.cat([x_cpu, x_new], 1)
            m, m_cpu = torch.cat([m, m_new.to("tpu")], 1), torch.cat([m_cpu, m_new], 1)
            before = handed()
            outs = ops(x, m)
            after = handed()
            calls.append(sum(after[k] - before[k] for k in names))
            capacities.append(x.tpu_storage.shape[1])
            full = x_cpu.shape[1] == capacities[-1]  # x is its whole storage, not a front: ordinary ops
            for j, (out, fronts) in enumerate(zip(outs, (not full, not full, True))):  # (a read would sync)
                assert (growth.front(out) is not None) == fronts
                if fronts:
                    assert growth.front(out).length == x_cpu.shape[1]
                    node_keys.setdefault((j, out.tpu_storage.shape), set()).add(out.tpu_storage.array.node.key)
            for out, expected in zip(outs, ops(x_cpu, m_cpu)):
                assert torch.equal(out.cpu(), expected)
        regrown = [i for i in range(len(capacities)) if i == 0 or capacities[i] != capacities[i - 1]]
        assert len(regrown) >= 2, capacities
        # Python: the first two steps on each padded storage (the inner calls compile, then teach), and the step
        # where x fills its storage; none other
        python = {i + k for i in regrown for k in (0, 1)} | {i for i, c in enumerate(capacities) if i + 4 == c}
        assert all(calls[i] > 0 for i in regrown), (calls, capacities)
        assert all(calls[i] == 0 for i in range(len(calls)) if i not in python), (calls, capacities)
        assert all(len(keys) == 1 for keys in node_keys.values()), node_keys

        # the node the kernel records is the one the Python rewrite records (bounded.NATIVE off: Python makes them)
        cpp = [out.tpu_storage.array.node.key for out in ops(x, m)]
        before = handed()
        bounded.NATIVE[0] = False
        try:
            python = [out.tpu_storage.array.node.key for out in ops(x, m)]
        finally:
            bounded.NATIVE[0] = True
        assert python == cpp and sum(handed()[k] - before[k] for k in names) >= len(names)

        before = handed()
        with telemetry.Recorder() as events:
            y = x * 2.0
        assert [e.name for e in events if e.kind == telemetry.EventKind.OP] == ["aten::mul.Tensor"]
        assert growth.front(y) is not None and handed() == before

        other_cpu = torch.randn(2, x_cpu.shape[1], 32)  # not grown, not broadcast along the grown dim
        other = other_cpu.to("tpu")
        out = x + other
        assert recording.stats()["python_ops"]["aten::add.Tensor"] == before["aten::add.Tensor"] + 1
        assert growth.front(out) is None
        torch.testing.assert_close(out.cpu(), x_cpu + other_cpu)


def test_a_broadcast_copy_of_a_front_is_recorded_in_cpp_once_taught():
    """Grouped-query attention with gradients repeats each key head for its query group (``repeat_interleave``:
    an expand, then ``clone``); over a cache grown by appends the clone's input is the expanded front, which
    runtime/bounded.py copies on the padded extent (``_copy``). The recording kernel records that copy as the
    rewrite makes it, once taught, at every length: the same node, a front, values as on CPU. A copy of a front
    without a broadcast dim stays the rewrite's own (an ordinary copy it remembers), on the Python path."""
    from torchtpu_lab.runtime import bounded, growth

    def handed() -> int:
        return recording.stats()["python_ops"].get("aten::clone", 0)

    torch.manual_seed(0)
    k_cpu = torch.randn(2, 1, 3, 32)  # 256 bytes a position: capacity 64
    with torchtpu_lab.eager_mode("fused"), torch.no_grad():
        k = k_cpu.to("tpu")
        calls, node_keys = [], set()
        for step in range(12):
            piece = torch.randn(2, 1, 1, 32)
            k, k_cpu = torch.cat([k, piece.to("tpu")], 2), torch.cat([k_cpu, piece], 2)
            before = handed()
            out = k.repeat_interleave(3, dim=1)
            calls.append(handed() - before)
            assert growth.front(out) is not None and growth.front(out).length == k_cpu.shape[2]
            node_keys.add(out.tpu_storage.array.node.key)
            assert torch.equal(out.cpu(), k_cpu.repeat_interleave(3, dim=1))
        # the outer call and the rewrite's inner one go to Python twice (the inner compiles, then teaches); then none
        assert calls == [2, 2] + [0] * 10, calls
        assert len(node_keys) == 1, node_keys

        cpp = k.repeat_interleave(3, dim=1).tpu_storage.array.node.key
        bounded.NATIVE[0] = False  # the node the Python rewrite records for the same call
        try:
            assert k.repeat_interleave(3, dim=1).tpu_storage.array.node.key == cpp
        finally:
            bounded.NATIVE[0] = True

        before = handed()
        copy = k.clone()  # no broadcast dim: the ordinary copy of n positions, remembered as a copy of k
        assert handed() > before and growth.front(copy) is None
        assert id(copy.tpu_storage) in bounded._COPIES and torch.equal(copy.cpu(), k_cpu)


def test_advanced_indexing_is_recorded_in_cpp_once_taught():
    """``x[i, j]``, ``x[:, j]`` and ``x[i, j] = v`` take their indices as a list of optional tensors
    (``aten::index.Tensor``, ``index_put_``), which the recording kernel keys element by element (an absent one
    keyed as such): once taught, their calls are recorded without Python, values are CPU's, and an index out of
    range, recorded in C++ with the op's check flags, raises PyTorch's IndexError at the sync naming the op and
    the line, leaving the tensor it indexed usable."""
    x_cpu = torch.randn(4, 6, 5)
    i_cpu, j_cpu = torch.tensor([[0], [2], [3]]), torch.tensor([[1, 5, -1]])
    ops = ("aten::index.Tensor", "aten::index_put_")

    def handed():
        stats = recording.stats()["python_ops"]
        return sum(stats.get(name, 0) for name in ops)

    with torchtpu_lab.eager_mode("fused"):
        x, i, j = x_cpu.to("tpu"), i_cpu.to("tpu"), j_cpu.to("tpu")
        calls = []
        for _ in range(5):
            before, recorded = handed(), _recorded()
            y, z = x[i, j], x[:, j[0]]
            t = x.clone()
            t[i[:, 0], j[0, :3]] = y[:, 0] * 2
            calls.append((handed() - before, _recorded() - recorded))
            torch.testing.assert_close(y.cpu(), x_cpu[i_cpu, j_cpu])
            torch.testing.assert_close(z.cpu(), x_cpu[:, j_cpu[0]])
            expected = x_cpu.clone()
            expected[i_cpu[:, 0], j_cpu[0, :3]] = x_cpu[i_cpu, j_cpu][:, 0] * 2
            torch.testing.assert_close(t.cpu(), expected)
        assert all(handed == 0 for handed, _ in calls[2:]), calls
        assert all(recorded >= 3 for _, recorded in calls[2:]), calls

        rows = [torch.tensor([1]).to("tpu"), torch.tensor([2]).to("tpu"), torch.tensor([7]).to("tpu")]
        with pytest.raises(IndexError, match=r"aten::index\.Tensor: index 7 is out of bounds.*test_recording_kernel"):
            for row in rows:
                before = handed()
                picked = x[row]
                if row is rows[-1]:
                    assert handed() == before  # recorded in C++, with its check
                picked.cpu()
        torch.testing.assert_close(x.cpu(), x_cpu)


def test_arange_of_a_growing_length_is_recorded_in_cpp_once_taught():
    """``torch.arange(n)`` of the length an append just grew a tensor to (``transformers`` builds its masks from
    ``arange(kv_length)`` every token) is runtime/bounded.py's ``arange`` of that tensor's capacity viewed to
    ``n``: the recording kernel records it so once taught, at every length, until the storage regrows; the result
    is a front (so ``+ offset`` after it is rewritten too) with CPU's values. A length no append reached recently —
    the sequence stopped growing several syncs ago — gives an ordinary ``arange`` on either path."""
    from torchtpu_lab.runtime import growth

    name = "aten::arange"
    with torchtpu_lab.eager_mode("fused"):
        m = torch.ones(1, 3, 512).to("tpu")  # 2 KiB a position: capacity 64, doubling
        calls, capacities = [], []
        for _ in range(70):
            m = torch.cat([m, torch.ones(1, 1, 512).to("tpu")], 1)
            n = m.shape[1]
            before = recording.stats()["python_ops"].get(name, 0)
            r = torch.arange(n, device="tpu")
            calls.append(recording.stats()["python_ops"].get(name, 0) - before)
            capacities.append(m.tpu_storage.shape[1])
            shifted = r + 2
            full = n == capacities[-1]
            assert (growth.front(r) is None) == full and (growth.front(shifted) is None) == full
            assert torch.equal(shifted.cpu(), torch.arange(n) + 2)
        regrown = [i for i in range(len(capacities)) if i == 0 or capacities[i] != capacities[i - 1]]
        assert len(regrown) >= 2, capacities
        python = {i + k for i in regrown for k in (0, 1)} | {i for i, c in enumerate(capacities) if i + 4 == c}
        assert all(calls[i] == 0 for i in range(len(calls)) if i not in python), (calls, capacities)
        assert any(calls[i] for i in python), calls

        for _ in range(growth.RECENT_SYNCS + 1):  # the sequence stops growing
            (m + 1).sum().item()
        r = torch.arange(m.shape[1], device="tpu")
        assert growth.front(r) is None and torch.equal(r.cpu(), torch.arange(m.shape[1]))


def test_first_appends_to_an_empty_accumulator_are_recorded_in_cpp_once_taught():
    """A ``DynamicCache`` starts each layer's keys with ``torch.cat([torch.tensor([]), keys], -2)``: growth.py's
    first append, into a new padded buffer (a training step with ``use_cache`` makes one per layer and step, a
    ``generate`` call one per layer). Once taught, the recording kernel records such an append of the same piece
    geometry in C++ — a new buffer of the capacity the lesson fixed, its own lineage, its length noted for
    factories — and the appends into its spare capacity after it; values are CPU's."""
    from torchtpu_lab.runtime import growth

    name = "aten::cat"
    with torchtpu_lab.eager_mode("fused"):
        handed, lineages, capacities = [], set(), set()
        for step in range(6):
            before = recording.stats()["python_ops"].get(name, 0)
            keys_cpu = torch.randn(1, 2, 5, 8)
            acc = torch.tensor([]).to("tpu")  # an empty accumulator, as DynamicCache makes it
            keys = torch.cat([acc, keys_cpu.to("tpu")], -2)
            more_cpu = torch.randn(1, 2, 1, 8)
            longer = torch.cat([keys, more_cpu.to("tpu")], -2)
            handed.append(recording.stats()["python_ops"].get(name, 0) - before)
            assert growth.padded_length(keys, 2) == 5 and growth.padded_length(longer, 2) == 6
            assert growth.recent_capacity(5) == keys.tpu_storage.shape[2]
            lineages.add(growth._GROWN_IDS[id(keys.tpu_storage)][2])
            capacities.add(keys.tpu_storage.shape[2])
            torch.testing.assert_close(longer.cpu(), torch.cat([keys_cpu, more_cpu], -2))
            torch.testing.assert_close(keys.cpu(), keys_cpu)
        assert all(h == 0 for h in handed[2:]), handed  # the first calls teach both appends
        assert len(lineages) == 6 and len(capacities) == 1, (lineages, capacities)

        same_rank_cpu = torch.randn(3, 4)  # an empty accumulator of the piece's rank: `cat([zeros(3, 0), x], 1)`
        for _ in range(3):
            before = recording.stats()["python_ops"].get(name, 0)
            out = torch.cat([torch.zeros(3, 0).to("tpu"), same_rank_cpu.to("tpu")], 1)
            torch.testing.assert_close(out.cpu(), same_rank_cpu)
        assert recording.stats()["python_ops"].get(name, 0) == before
        with pytest.raises(RuntimeError):  # a mismatched accumulator: PyTorch's error, from the Python path
            torch.cat([torch.zeros(2, 0).to("tpu"), same_rank_cpu.to("tpu")], 1).cpu()


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_a_number_left_at_its_default_is_keyed_apart_from_one_given(mode):
    """``add(x, y)`` leaves ``alpha`` at its default, which the Python kernel is not passed, so the executable it
    teaches has ``alpha`` as a constant: a later ``add(x, y, alpha=2)`` (the same type of number, a graph input)
    must not find that entry (it did, and returned ``x + y``)."""
    x, y = torch.ones(4).to("tpu"), torch.ones(4).to("tpu")
    got = []
    with torchtpu_lab.eager_mode(mode):
        for alpha in (None, None, None, 2, 3, 1, None, 2):
            kwargs = {} if alpha is None else {"alpha": alpha}
            got.append((torch.add(x, y, **kwargs).cpu()[0].item(), x.clone().add_(y, **kwargs).cpu()[0].item()))
    assert got == [(2.0, 2.0)] * 3 + [(3.0, 3.0), (4.0, 4.0), (2.0, 2.0), (2.0, 2.0), (3.0, 3.0)]
