"""``python -m torchtpu_lab.native``: build the native core now (``make install`` runs it) and print where.

Importing the package already builds it (registration loads the core; the build prints its time to stderr), so
this mostly finds it built; it builds here too when the import did not (``TORCHTPU_LAB_NATIVE=0``)."""

from . import status
from .build import build

print(build(verbose=True))
print(status().describe())
