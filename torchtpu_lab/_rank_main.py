"""One rank started by :func:`torchtpu_lab.distributed.launch` (``python -m torchtpu_lab._rank_main DIR``).

An entry point (top layer: it imports the whole package, which registers the device and the backend). Runs
the function, writes ``("ok", value)`` or ``("error", traceback)`` to ``DIR/rank<r>.result``. A failing
rank leaves with ``os._exit`` so that no exit handler (JAX's distributed shutdown barrier) waits for ranks
that are still running.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import traceback


def _resolve(spec: dict):
    if "source" in spec:
        namespace: dict = {"__name__": "__torchtpu_lab_launch__"}
        exec(compile(spec["source"], f"<launched {spec['name']}>", "exec"), namespace)
        return namespace[spec["name"]]
    obj = importlib.import_module(spec["module"])
    for part in spec["name"].split("."):
        obj = getattr(obj, part)
    return obj


def _to_cpu(value):
    import torch
    from torch.utils import _pytree

    return _pytree.tree_map(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, value)


def main(workdir: str) -> None:
    rank = int(os.environ["RANK"])
    with open(os.path.join(workdir, "spec.pkl"), "rb") as f:
        spec = pickle.load(f)
    import torchtpu_lab  # noqa: F401  (registers the device and the tpu process-group backend)
    from torchtpu_lab.distributed import rank_status, watchdog

    watchdog.start()  # also watches for the launcher's abort signal
    reporter = rank_status.Reporter(workdir, rank)  # the notebook's panel shows each rank's progress
    result_path = os.path.join(workdir, f"rank{rank}.result")
    try:
        value = _to_cpu(_resolve(spec["fn"])(*spec["args"]))
        payload = pickle.dumps(("ok", value))
        reporter.finish(ok=True)
    except BaseException:
        reporter.finish(ok=False)
        with open(result_path, "wb") as f:
            pickle.dump(("error", traceback.format_exc()), f)
        sys.stdout.flush()
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    with open(result_path, "wb") as f:
        f.write(payload)


if __name__ == "__main__":
    main(sys.argv[1])
