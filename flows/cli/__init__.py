"""The ``sailor`` command line: ``app`` builds it, one module per group of commands."""
