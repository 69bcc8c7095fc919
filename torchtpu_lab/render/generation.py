"""A token loop's rates in a profile report: tokens/s, time to first token, programs built per token, and the
host's and the device's time per token.

The figures are :class:`~torchtpu_lab.records.GenerationStats`, computed by the collector
(``profiling/generation.py``); this module only lays them out, as text lines and as HTML chips."""

from __future__ import annotations

from html import escape

from ..records import GenerationStats
from ..units import fmt_s


def generation_parts(g: GenerationStats) -> list[tuple[str, str]]:
    """(label, value) pairs, in the order both renderings show them."""
    parts = [("tokens", str(g.tokens)), ("tokens/s", f"{g.tokens_per_s:.1f}")]
    if g.decode_tokens_per_s is not None:
        parts.append(("decode tokens/s", f"{g.decode_tokens_per_s:.1f}"))
    parts += [("time to first token", fmt_s(g.first_token_s)), ("programs built", str(g.programs)),
              ("programs per token", f"{g.programs_per_token:.2f}")]
    if g.host_s_per_token is not None:
        parts.append(("host per token", fmt_s(g.host_s_per_token)))
    if g.device_s_per_token is not None:
        parts.append(("device per token", fmt_s(g.device_s_per_token)))
    return parts


def generation_text(g: GenerationStats | None) -> list[str]:
    """One line for a block that generated (none otherwise)."""
    if g is None:
        return []
    return ["generation: " + " \u00b7 ".join(f"{label} {value}" for label, value in generation_parts(g))]


def generation_html(g: GenerationStats | None) -> str:
    """A heading and a row of chips for a block that generated (nothing otherwise)."""
    if g is None:
        return ""
    chips = "".join(f'<span class="ttl-chip">{escape(label)} <b>{escape(value)}</b></span>'
                    for label, value in generation_parts(g))
    return f'<h4>Generation</h4><div class="ttl-head ttl-generation">{chips}</div>'
