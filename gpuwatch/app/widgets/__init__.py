"""Widgets of the gpuwatch dashboard."""
