"""Regenerate every notebook: ``python notebooks/_build/make_all.py`` (from the repository root)."""

import glob
import os
import runpy

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    os.chdir(os.path.dirname(os.path.dirname(HERE)))  # make_01_quickstart.py writes relative to the repo root
    for script in sorted(glob.glob(os.path.join(HERE, "make_*.py"))):
        if os.path.basename(script) != "make_all.py":
            runpy.run_path(script, run_name="__main__")
            print("ran", os.path.relpath(script))
