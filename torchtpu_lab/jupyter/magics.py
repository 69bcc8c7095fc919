"""``%tpu`` (status, mode, cache, memory, metrics, watch) and ``%%tpu_profile`` (profile one cell)."""

from __future__ import annotations

import os
import shlex
import tempfile
from collections import deque

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display

from .. import caches, metrics
from ..device import memory
from ..profiling import profile
from ..runtime import compile_cache, cpu_fallback, modes
from ..runtime import state as runtime_state
from . import comm, dynamo_warnings
from .status import status, status_lines

USAGE = """usage:
  %tpu                      status of the tpu session
  %tpu mode [debug|strict|fused]
  %tpu cache                compile cache location and size;  %tpu cache clear  empties it
  %tpu memory [--top N]     live device tensors by size and role (parameter, gradient, optimizer state, ...)
  %tpu metrics [--all|--reset]  the metrics report (compile/execute times, counters; --all: internal caches)
  %tpu fallback [on|off]    the CPU fallback for ops without a tpu lowering
  %tpu watch [stop]         a live panel of memory, mode and compile counters
%%tpu_profile [--top N] [--xprof] [--no-flame] [--output DIR] [--repeat N] [--compare NAME]   profile the cell
      --repeat N      run the cell N times and report the medians (left in _tpu_profile)
      --compare NAME  also compare with a saved profile: a variable holding one, or an index into the
                      history _tpu_profiles (-1: the previous profiled cell)"""

#: how many profiled cells ``_tpu_profiles`` keeps (the oldest go first)
HISTORY = 20


class TextAndHtml:
    """A display object with a ``text/plain`` part for every viewer and an HTML part for notebooks."""

    def __init__(self, text: str, html: str | None = None):
        self.text = text
        self.html = html

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": self.text}
        if self.html is not None:
            bundle["text/html"] = self.html
        return bundle


def _calling_cell_number(shell) -> int | None:
    """The execution count of the cell that invoked the magic (found from its code's filename on the stack)."""
    import sys

    names = getattr(shell.compile, "_filename_map", {})
    frame = sys._getframe(1)
    while frame is not None:
        number = names.get(frame.f_code.co_filename)
        if number is not None:
            return number
        frame = frame.f_back
    return None


def _in_notebook(shell) -> bool:
    """True in a Jupyter kernel (which can show plotly figures), false in a terminal IPython."""
    return type(shell).__name__ == "ZMQInteractiveShell" or hasattr(shell, "kernel")


def _option(args: list[str], flag: str, what: str, convert=str, minimum: int | None = None):
    """The value after ``flag`` in ``args`` (``None`` when the flag is absent), converted; raises
    :class:`ValueError` saying what ``flag`` takes when the value is missing, is another option or is invalid."""
    if flag not in args:
        return None
    i = args.index(flag)
    raw = args[i + 1] if i + 1 < len(args) else None
    try:
        if raw is None or (convert is str and raw.startswith("--")):
            raise ValueError
        value = convert(raw)
    except ValueError:
        raise ValueError(f"{flag} takes {what}, got {raw or 'nothing'}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{flag} takes {what}, got {value}")
    return value


def _parse_top(args: list[str], default: int) -> int:
    top = _option(args, "--top", "a positive number of rows", int, minimum=1)
    return default if top is None else top


def parse_profile_args(line: str) -> dict:
    """The options of ``%%tpu_profile``; raises :class:`ValueError` naming the argument that is wrong."""
    args = shlex.split(line)
    takes_value = {"--top", "--output", "--repeat", "--compare"}
    i = 0
    while i < len(args):
        a = args[i]
        if a not in takes_value | {"--xprof", "--no-flame"}:
            raise ValueError(f"unknown option {a!r}" if a.startswith("-") else f"unexpected argument {a!r}")
        i += 2 if a in takes_value else 1
    output = _option(args, "--output", "a directory")
    if output is not None and "--xprof" not in args:
        raise ValueError("--output DIR is where --xprof writes its trace; add --xprof (or drop --output)")
    repeat = _option(args, "--repeat", "a positive number of runs", int, minimum=1)
    compare = _option(args, "--compare", "the name of a saved profile or an index into _tpu_profiles")
    return {"top": _parse_top(args, 10), "xprof": "--xprof" in args, "output": output,
            "flame": "--no-flame" not in args, "repeat": repeat or 1, "compare": compare}


@magics_class
class TpuMagics(Magics):
    @line_magic
    def tpu(self, line: str = ""):
        try:
            args = shlex.split(line)
        except ValueError as e:
            print(f"%tpu: {e}\n{USAGE}")
            return
        cmd = args[0] if args else "status"
        handler = getattr(self, f"_cmd_{cmd}", None)
        if handler is None:
            print(f"%tpu: unknown subcommand {cmd!r}\n{USAGE}")
            return
        try:
            return handler(args[1:])
        except ValueError as e:
            print(f"%tpu {cmd}: {e}\n{USAGE}")

    def _cmd_status(self, args):
        from ..render.html import status_html

        s = status()
        display(TextAndHtml("\n".join(status_lines(s)), status_html(s)))

    def _cmd_help(self, args):
        print(USAGE)

    def _cmd_mode(self, args):
        if not args:
            print(f"eager mode: {modes.current()}")
            return
        modes.set_eager_mode(args[0])
        print(f"eager mode: {modes.current()}")

    def _cmd_cache(self, args):
        if args and args[0] == "clear":
            print(runtime_state.clear_everything())
            return
        if args:
            raise ValueError(f"unknown cache action {args[0]!r}")
        print(f"compile cache: {compile_cache.directory() or '(off)'}, {compile_cache.entries()} entries on disk")
        for name, c in caches.stats().items():
            print(f"  {name}: {c['entries']}/{c['maxsize']} entries, {c['hits']} hits, {c['misses']} misses, "
                  f"{c['evictions']} evictions")

    def _cmd_memory(self, args):
        from ..render.text import fmt_bytes
        from . import roles as buffer_roles

        top = _parse_top(args, 10)
        everything = memory.largest(0, 1 << 30)
        roles = buffer_roles.roles_by_array(self.shell.user_ns)
        totals = dict.fromkeys(buffer_roles.ROLES, 0)
        for r in everything:
            totals[buffer_roles.role_kind(buffer_roles.role_of(r, roles))] += r["nbytes"]
        lines = [f"tpu:0 memory: {fmt_bytes(memory.allocated(0))} allocated, peak {fmt_bytes(memory.peak(0))}"]
        if everything:
            lines.append("  by role: " + " \u00b7 ".join(f"{role} {fmt_bytes(n)}" for role, n in totals.items() if n))
        for r in everything[:top]:
            lines.append(f"  {fmt_bytes(r['nbytes']):>10}  {buffer_roles.role_of(r, roles):<25} {r['dtype']}{r['shape']}"
                         f"  created at {r['source'] or 'n/a'}")
        if not everything:
            lines.append("  (no live tpu tensors)")
        print("\n".join(lines))

    def _cmd_metrics(self, args):
        if args and args[0] == "--reset":
            from .. import telemetry

            telemetry.reset()
            print("metrics reset")
            return
        if args and args[0] != "--all":
            raise ValueError(f"unknown metrics option {args[0]!r} (--all shows the internal caches, --reset)")
        print(metrics.metrics_report(internals=bool(args)))

    def _cmd_fallback(self, args):
        if args:
            if args[0] not in ("on", "off"):
                raise ValueError("fallback takes on or off")
            cpu_fallback.set_cpu_fallback(args[0] == "on")
        ops = cpu_fallback.summary()
        print(f"CPU fallback: {'on' if cpu_fallback.enabled() else 'off'}; "
              + (", ".join(f"{k} x{v['count']}" for k, v in ops.items()) or "no op has fallen back"))

    def _cmd_watch(self, args):
        from . import watch

        if args and args[0] == "stop":
            watch.stop()
            print("stopped the tpu watch panel")
            return
        display(watch.start())

    @cell_magic
    def tpu_profile(self, line: str, cell: str):
        """Run the cell under a profile, show the report, then let the cell's exception (if any) reach IPython
        as if the magic were not there, so "Run All", nbclient and papermill stop at a failing cell."""
        __tracebackhide__ = True
        try:
            opts = parse_profile_args(line)
            baseline = self._baseline(opts["compare"])
        except ValueError as e:
            raise UsageError(f"%%tpu_profile: {e}\n{USAGE}") from None
        runs = []
        with dynamo_warnings.held() as graph_break_warnings:
            for _ in range(opts["repeat"]):
                prof_obj, error = self._profile_once(cell, opts)
                runs.append(prof_obj)
                if error is not None:
                    break
        if not any(r.graph_breaks for r in runs):  # the report has no finding for them: Dynamo's words stay
            dynamo_warnings.release(graph_break_warnings)
        if len(runs) > 1 and error is None:
            from ..profiling.repeat import Repeated

            prof_obj = Repeated(runs)
        self.shell.user_ns["_tpu_profile"] = prof_obj
        history = self.shell.user_ns.get("_tpu_profiles")
        if not isinstance(history, deque):
            history = self.shell.user_ns["_tpu_profiles"] = deque(maxlen=HISTORY)
        history.append(prof_obj)
        self._show_report(prof_obj, opts)
        if baseline is not None:
            from ..profiling.compare import compare

            comparison = compare(baseline, prof_obj, (opts["compare"], "this cell"))
            comm.note_comparison(prof_obj, comparison)  # the side panel shows it with this cell's profile
            display(TextAndHtml(comparison.text(), comparison._repr_html_()))
        if error is not None:
            raise error

    def _baseline(self, name: str | None):
        """The profile ``--compare NAME`` names: a user variable holding one, or an index into the history."""
        if name is None:
            return None
        ns = self.shell.user_ns
        if name in ns:
            found = ns[name]
        else:
            try:
                index = int(name)
            except ValueError:
                raise ValueError(f"--compare {name}: no variable {name!r} and not an index into _tpu_profiles"
                                 ) from None
            history = ns.get("_tpu_profiles") or ()
            if not -len(history) <= index < len(history):
                raise ValueError(f"--compare {name}: _tpu_profiles holds {len(history)} profiles")
            found = history[index]
        if not (hasattr(found, "summary") and hasattr(found, "report")):
            raise ValueError(f"--compare {name}: {type(found).__name__} is not a profile")
        return found

    def _profile_once(self, cell: str, opts: dict):
        """Run the cell once under a profile; returns the profile and the cell's error (``None`` if it ran)."""
        xprof_dir = None
        if opts["xprof"]:
            xprof_dir = opts["output"] or os.path.join(tempfile.gettempdir(), "torchtpu_lab_xprof",
                                                       f"cell_{self.shell.execution_count}")
        prof_obj = None
        result = None
        outer = _calling_cell_number(self.shell)
        saved_count = self.shell.execution_count
        names = getattr(self.shell.compile, "_filename_map", None)
        names_before = dict(names) if names is not None else {}
        if outer is not None:
            # while a cell runs, IPython's count is already the next cell's: the displayhook stores a value
            # under count - 1, so the body runs with outer + 1 and its code is then named as cell [outer]
            self.shell.execution_count = outer + 1
        shell = self.shell
        # the body's traceback is shown once, by IPython, when the exception is re-raised after the report
        own = shell.__dict__.get("showtraceback")
        shell.showtraceback = _quiet
        closing_error = None
        try:
            with profile(xprof_dir=xprof_dir) as prof:
                prof_obj = prof
                # the comment stands for the %%tpu_profile line, so reported line numbers are the cell's own
                # (IPython strips leading blank lines, not comments)
                result = shell.run_cell("# %%tpu_profile\n" + cell, store_history=False, silent=False)
        except BaseException as e:  # the cell's own errors are in ``result``: this is closing the profile
            if prof_obj is None:  # (a Ctrl-C while the XProf trace is written): still show what was recorded
                raise
            closing_error = e
        finally:
            if own is None:
                del shell.showtraceback  # back to the class's method
            else:
                shell.showtraceback = own
            shell.execution_count = saved_count
            if outer is not None and names is not None:
                _name_body_as_cell(names, names_before, outer)
        error = None
        if result is not None:
            error = result.error_before_exec or result.error_in_exec
        error = error or prof_obj.flush_exception or closing_error
        if error is not None and prof_obj.error is None:
            prof_obj.error = f"{type(error).__name__}: {error}"
        return prof_obj, error

    def _show_report(self, prof_obj, opts: dict) -> None:
        report = prof_obj.report(opts["top"])
        from ..render import html as render_html
        from ..render import plot
        from ..render.text import profile_text

        runs = getattr(prof_obj, "runs", None)
        head = f"median of {len(runs)} runs\n" if runs else ""
        display(TextAndHtml(head + profile_text(report),
                            (f"<div>{head}</div>" if head else "") + render_html.profile_html(report)))
        if not _in_notebook(self.shell):
            return  # a terminal has no plotly renderer; the text report above is the whole report
        if opts["flame"]:
            display(plot.flame_bundle(report.flame))
        if report.roofline is not None and report.roofline.programs:
            display(plot.roofline_bundle(report.roofline))
        if len(report.memory.timeline) > 2:
            display(plot.memory_bundle(report.memory.timeline, report.memory.limit))


def _name_body_as_cell(names: dict, before: dict, outer: int) -> None:
    """The profiled body was compiled under number ``outer + 1`` (so that its value is ``Out[outer]``): name its
    code as the cell the user ran, ``cell [outer]``, in reports and tracebacks."""
    for filename, number in list(names.items()):
        if number == outer + 1 and before.get(filename) != number:
            names[filename] = outer


def _quiet(*args, **kwargs) -> None:
    """Stands in for ``shell.showtraceback`` while the profiled body runs (the error is re-raised after)."""
