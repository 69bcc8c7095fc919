"""The suite's own state restore (conftest.py): a test that leaves the session broken is reported, not hidden."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

HERE = pathlib.Path(__file__).resolve().parent


def test_work_that_fails_when_the_mode_is_restored_is_reported(tmp_path):
    """Restoring the eager mode runs what the test left pending; if that fails, the test errors at teardown
    (after everything else is restored) instead of the failure being swallowed."""
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_leaves_failing_work.py").write_text(textwrap.dedent('''
        import torchtpu_lab
        from torchtpu_lab.runtime import fused

        def test_leaves_failing_work():
            torchtpu_lab.set_eager_mode("strict")

            def sync(*args, **kwargs):
                raise RuntimeError("pending work failed")

            fused.sync = sync  # what the restore runs next fails, as a test's poisoned pending work would
    '''))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env=dict(os.environ, TORCHTPU_LAB_PLATFORM="cpu"))
    assert "1 passed, 1 error" in out.stdout, out.stdout + out.stderr
    # the teardown error is the pending work's own failure, raised once everything else is restored
    assert "ERROR test_leaves_failing_work.py::test_leaves_failing_work - RuntimeError: p" in out.stdout
    assert "pending work failed" in out.stdout
