"""What a run's figures mean, pure: peaks and MFU, a step's parts, bounded histories and
medians, the scaling probe's plan and table.

No Textual, no TensorFlow, no I/O. The fold (gpuwatch.runstate), the advisor, the
dashboard, headless mode, the export and the supervisor read these; each module is
imported directly (this package re-exports nothing).
"""
