"""The fault cases of issue 14, and the check that decides whether each one holds, in one place.

``tests/test_faults.py`` and ``tests/test_profile_truth.py`` run these as tests; ``bench/faults_table.py`` runs
the very same checks to count "tried" and "held" for ``docs/reliability.md``. Keeping the lists *and* the checks
here (not in either user) is what stops the table from drifting from the tests: a case added here is tested
and counted, and "held" in the table means "this test passes".

Not collected by pytest (no ``test_`` prefix); imported as ``fault_cases`` from the tests directory.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
D = "tpu"


def child_env() -> dict[str, str]:
    """The environment of a child process that must import this checkout (storms, absurd sizes)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
    return env


# ---- out-of-range indices and other data-dependent errors ------------------------------------------------------


def _x() -> torch.Tensor:
    return torch.arange(5.0, device=D)


def _i(*v: int) -> torch.Tensor:
    return torch.tensor(list(v), device=D)


#: case -> (the error PyTorch's CPU path raises, the faulty call)
OUT_OF_RANGE: dict[str, tuple[type[BaseException], Callable[[], object]]] = {
    "index": (IndexError, lambda: _x()[_i(100)]),
    "index negative": (IndexError, lambda: _x()[_i(-6)]),
    "index cpu indices": (IndexError, lambda: _x()[torch.tensor([100])]),
    "index_put_": (IndexError, lambda: _x().index_put_((_i(7),), torch.tensor(1.0, device=D))),
    "setitem": (IndexError, lambda: _x().__setitem__(_i(7), 1.0)),
    "bool mask wrong length": (IndexError, lambda: _x()[torch.tensor([True, False], device=D)]),
    "index_select": (IndexError, lambda: _x().index_select(0, _i(5))),
    "embedding": (IndexError, lambda: F.embedding(_i(9), torch.randn(3, 2, device=D))),
    "gather": (RuntimeError, lambda: _x().gather(0, _i(5))),
    "scatter_": (RuntimeError, lambda: _x().scatter_(0, _i(5), 1.0)),
    "scatter_add_": (RuntimeError, lambda: _x().scatter_add_(0, _i(5), torch.ones(1, device=D))),
    "index_add_": (IndexError, lambda: _x().index_add_(0, _i(5), torch.ones(1, device=D))),
    "take": (IndexError, lambda: _x().take(_i(5))),
    "cross_entropy target": (IndexError, lambda: F.cross_entropy(torch.randn(2, 3, device=D), _i(0, 5))),
    "multinomial negative": (RuntimeError, lambda: torch.multinomial(torch.tensor([0.5, -0.1, 0.6], device=D), 1)),
    "integer floor division by zero": (RuntimeError, lambda: _i(1, 2) // _i(1, 0)),
    "integer remainder by zero": (RuntimeError, lambda: _i(1, 2) % _i(1, 0)),
    "integer division by scalar zero": (RuntimeError, lambda: _i(1, 2) // 0),
}


def check_out_of_range(case: str) -> None:
    """The case raises CPU's error type naming the op and the user line (a mask of the wrong length is caught
    by PyTorch before any op), leaves nothing pending, and new work computes correctly afterwards."""
    error, fn = OUT_OF_RANGE[case]
    with pytest.raises(error) as info:
        r = fn()
        torch.tpu.synchronize()  # in-place cases return nothing to read: a sync surfaces what they reported
        if isinstance(r, torch.Tensor):
            r.cpu()
    message = str(info.value)
    if case != "bool mask wrong length":
        assert "aten::" in message and "fault_cases.py" in message, message  # names the op and the user line
    y = _x() * 2
    assert torch.equal(y.cpu(), torch.arange(5.0) * 2)
    assert torch.equal(_x()[_i(1, -1)].cpu(), torch.tensor([1.0, 4.0]))


# ---- absurd sizes and bad torch.tpu arguments -------------------------------------------------------------------

#: expression -> the message PyTorch's CPU path raises for it
ABSURD: dict[str, str] = {
    "torch.randn(2**62, device='tpu')": "Storage size calculation overflowed",
    "torch.empty(2**40, 2**40, device='tpu')": "Storage size calculation overflowed",
    "torch.zeros(2**31, 2**31, 4, device='tpu')": "Storage size calculation overflowed",
    "torch.full((2**62,), 1.0, device='tpu')": "Storage size calculation overflowed",
    "torch.ones(2, device='tpu').new_empty((2**62,))": "Storage size calculation overflowed",
    "torch.randint(0, 5, (2**62,), device='tpu')": "Storage size calculation overflowed",
    "torch.ones(2, device='tpu').resize_(2**62)": "Storage size calculation overflowed",
    "torch.ones(-1, device='tpu')": "Trying to create tensor with negative dimension -1: [-1]",
    "torch.empty(-2, 3, device='tpu')": "Trying to create tensor with negative dimension -2: [-2, 3]",
}

def absurd_sizes_in_a_child() -> tuple[dict[tuple[str, str], bool], bool]:
    """Run every :data:`ABSURD` expression in strict and in fused mode in one child process (an abort must not
    take the caller down). Returns ``{(expression, mode): raised CPU's message}`` and whether the child still
    computed correctly afterwards."""
    import subprocess
    import sys

    modes = ("strict", "fused")
    lines = ["import torch, torchtpu_lab"]
    for i, expr in enumerate(ABSURD):
        for mode_name in modes:
            lines += [f"torchtpu_lab.set_eager_mode({mode_name!r})",
                      "try:", f"    {expr}", f"    print('NO ERROR {i} {mode_name}')",
                      "except RuntimeError as e:", f"    print('{i} {mode_name}', e)"]
    lines.append("print('ALIVE', (torch.ones(3, device='tpu') * 2).sum().item())")
    out = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, timeout=240,
                         env=child_env())
    printed = out.stdout.splitlines()
    outcomes = {}
    for i, (expr, message) in enumerate(ABSURD.items()):
        for mode_name in modes:
            found = [ln for ln in printed if ln.startswith(f"{i} {mode_name} ")]
            outcomes[expr, mode_name] = len(found) == 1 and message in found[0]
    return outcomes, out.returncode == 0 and "ALIVE 6.0" in printed


#: label -> a torch.tpu call with a device argument that is not a tpu device
BAD_DEVICE_CALLS: dict[str, Callable[[], object]] = {
    "set_device('cuda:0')": lambda: torch.tpu.set_device("cuda:0"),
    "memory_allocated('tpu:7')": lambda: torch.tpu.memory_allocated("tpu:7"),
    "synchronize(9)": lambda: torch.tpu.synchronize(9),
    "get_rng_state('cpu')": lambda: torch.tpu.get_rng_state("cpu"),
    "set_device(object())": lambda: torch.tpu.set_device(object()),
}

#: label -> a value that is not an RNG state (built on demand: a tensor made at import would outlive the test)
BAD_RNG_STATES: dict[str, Callable[[], object]] = {
    "a string": lambda: "junk",
    "float32[3]": lambda: torch.zeros(3),
    "int64[16]": lambda: torch.zeros(16, dtype=torch.int64),
}


def check_bad_device(label: str) -> None:
    """The call raises a ``ValueError`` that mentions tpu, and the current device is untouched."""
    with pytest.raises(ValueError, match="tpu"):
        BAD_DEVICE_CALLS[label]()
    torch.tpu.synchronize(0)
    assert torch.tpu.current_device() == 0


def check_bad_rng_state(label: str) -> None:
    """``set_rng_state`` refuses the value with the expected message and the RNG state is unchanged."""
    before = torch.tpu.get_rng_state()
    with pytest.raises(RuntimeError, match="set_rng_state: expected a torch.uint8 tensor of 16 bytes"):
        torch.tpu.set_rng_state(BAD_RNG_STATES[label]())
    assert torch.equal(torch.tpu.get_rng_state(), before)


# ---- %%tpu_profile: bad options and user strings in the report ------------------------------------------------

#: (options, the word the refusal must name)
PROFILE_BAD_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--top -5", "--top"),
    ("--top x", "--top"),
    ("--output /tmp/x", "--xprof"),
    ("--frobnicate", "--frobnicate"),
    ("--xprof --output", "--output"),
)


def check_bad_profile_option(ip: "InteractiveShell", line: str, word: str) -> None:
    """``%%tpu_profile LINE`` is refused with a ``UsageError`` naming ``word``, before the body runs."""
    from IPython.core.error import UsageError
    from IPython.utils.capture import capture_output

    ip.user_ns.pop("ran_anyway", None)
    with capture_output():
        result = ip.run_cell(f"%%tpu_profile {line}\nran_anyway = True\n")
    assert isinstance(result.error_in_exec, UsageError) and word in str(result.error_in_exec), line
    assert "ran_anyway" not in ip.user_ns


#: strings a user can put in a cell (source lines, error messages) that HTML or plotly would interpret
HOSTILE_STRINGS: tuple[str, ...] = (
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "\"><b onmouseover=alert(1)>bold</b>",
    "</pre></div><h1>out of the report</h1>",
)


def check_escaped(ip: "InteractiveShell", hostile: str) -> None:
    """A profiled cell whose source line and error message carry ``hostile``: the HTML report and the flame
    graph built from it (labels, ids and hover, which plotly renders as HTML) contain it only escaped."""
    from test_jupyter import run

    from torchtpu_lab.render import plot

    result, _, html = run(ip, f"%%tpu_profile --no-flame\nesc = (torch.ones(3, device='tpu') * len({hostile!r}))"
                              f".sum().item()\nraise ValueError({hostile!r})\n")
    assert isinstance(result.error_in_exec, ValueError) and str(result.error_in_exec) == hostile
    assert hostile not in html and escape(hostile) in html, html[-2000:]
    fig = plot.flame_figure(ip.user_ns["_tpu_profile"].report().flame)
    icicle = fig.data[0]
    strings = [*icicle.labels, *icicle.ids, *icicle.parents, *(h for _, h in icicle.customdata)]
    assert not any("<" in s for s in strings), [s for s in strings if "<" in s]
    assert any(escape(repr(hostile)) in s for s in strings), strings  # the source line reached the hover
