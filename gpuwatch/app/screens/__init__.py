"""Modal screens of the gpuwatch dashboard."""
