"""Token generation in a profiled block: tokens/s, time to first token, programs built per token.

A decode loop — ``model.generate``, or any loop that appends each new token with ``torch.cat`` — grows a
sequence one position per step. Every append on tpu is an op event of :data:`~torchtpu_lab.runtime.growth.APPEND`
carrying the sequence it belongs to (``lineage``: shared by all appends of one growing tensor) and how many
positions it added. The sequence with the most one-position appends is the token stream (``input_ids``; a KV
cache grows once per step as well, but starts with the whole prompt and lags by one). Nothing here is specific
to ``transformers``. Collectors never render: the renderers show :class:`GenerationStats` (or nothing, for a
block that generated nothing).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..runtime.growth import APPEND
from ..telemetry import EventKind


@dataclass(frozen=True)
class GenerationStats:
    """``tokens`` new positions of the token stream; ``tokens_per_s`` over the block's wall time;
    ``first_token_s`` from the block's start to the first token's append (the prompt's forward included);
    ``programs`` compiled or loaded from disk in the block, and ``programs_per_token``."""

    tokens: int
    wall_s: float
    tokens_per_s: float
    first_token_s: float
    programs: int
    programs_per_token: float


def generation_stats(prof) -> GenerationStats | None:
    """The generation in ``prof`` (a :class:`~.session.Profile`), or ``None`` when nothing was appended token by
    token (at least two one-position appends to one sequence)."""
    appends = [e for e in prof.events if e.kind == EventKind.OP and e.name == APPEND and e.detail.get("appended") == 1]
    if not appends:
        return None
    lineage, tokens = Counter(e.detail["lineage"] for e in appends).most_common(1)[0]
    if tokens < 2:
        return None
    first = min(e.t for e in appends if e.detail["lineage"] == lineage)
    programs = len(prof.compiles)
    wall = prof.wall_s
    return GenerationStats(tokens, wall, tokens / wall if wall > 0 else 0.0, max(first - prof.t0, 0.0), programs,
                           programs / tokens)
