"""Renderers of the one report model: terminal (rich), Markdown, HTML, JSON."""
