"""Profiling: ``with torchtpu_lab.profile() as prof: ...`` records what the runtime did in the block.

Like pyinstrument, the pipeline reads one way: :mod:`.collector` records events (from telemetry) while the block
runs, :mod:`.session` holds them as a :class:`Profile`, :mod:`.processors` turns them into tables and trees,
and :mod:`torchtpu_lab.render` presents those as text, HTML, JSON or plotly figures.
"""

from .collector import profile
from .session import Profile

__all__ = ["profile", "Profile"]
