"""Prefect flows and the ``sailor`` command line (the outermost layer)."""
