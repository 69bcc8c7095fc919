"""Renderers: turn computed summaries into text (and, later, HTML). They never compute."""
