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

from ..records import GenerationStats, Summary
from ..runtime.growth import APPEND
from ..telemetry import EventKind

__all__ = ["GenerationStats", "generation_stats", "growth_hint"]


def generation_stats(prof, summary: Summary | None = None) -> GenerationStats | None:
    """The generation in ``prof`` (a :class:`~.session.Profile`), or ``None`` when nothing was appended token by
    token (at least two one-position appends to one sequence). With the profile's ``summary``, the host's and the
    device's time per token too."""
    appends = [e for e in prof.events if e.kind == EventKind.OP and e.name == APPEND and e.detail.get("appended") == 1]
    if not appends:
        return None
    lineage, tokens = Counter(e.detail["lineage"] for e in appends).most_common(1)[0]
    if tokens < 2:
        return None
    times = [e.t for e in appends if e.detail["lineage"] == lineage]
    first, last = min(times), max(times)
    programs = len(prof.compiles)
    wall = prof.wall_s
    decode = (tokens - 1) / (last - first) if last > first else None
    host = device = None
    if summary is not None:
        host = summary.host_s / tokens
        device = None if summary.device_s is None else summary.device_s / tokens
    return GenerationStats(tokens, wall, tokens / wall if wall > 0 else 0.0, max(first - prof.t0, 0.0), programs,
                           programs / tokens, decode, host, device)


def growth_hint(op: str, arg: str, dim: int) -> str:
    """The fix for a program per token: ``dim`` of ``op``'s ``arg`` grew by one every step, which is a tensor
    appended to each step (a KV cache, a token sequence) read at its full length."""
    return (f"dim {dim} of {op} {arg} grows by one every step (a KV cache or a token sequence extended with "
            "torch.cat, as in generate()), so every step is a new program: read the growing tensor with "
            "F.scaled_dot_product_attention (transformers: attn_implementation=\"sdpa\"), which reads its padded "
            "storage with the length as an input (one program per capacity bucket), or allocate it once at its "
            "maximum length and write each step at a moving offset (buf[:, pos] = x; transformers: "
            "cache_implementation=\"static\"), which compiles once for any number of steps. Pointwise ops, casts, "
            "reductions, softmax, matmul, indexing and arange(n) of the length run on the padded storage too (eager "
            "attention, a left-padded batch's mask); other ops across the growing dim (flip, sort) read it at its "
            "length")
