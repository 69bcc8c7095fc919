"""The IPython side of torchtpu_lab: ``%load_ext torchtpu_lab`` and everything it installs.

* :mod:`.session` — what loading does: fused mode, the persistent cache, an end-of-cell sync, the banner;
* :mod:`.magics` — ``%tpu`` and ``%%tpu_profile``;
* :mod:`.watch` — the ``%tpu watch`` live panel;
* :mod:`.status` — the data both the banner and ``%tpu`` show.
"""

from .session import load_ipython_extension, unload_ipython_extension

__all__ = ["load_ipython_extension", "unload_ipython_extension"]
