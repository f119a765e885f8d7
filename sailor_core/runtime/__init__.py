"""The training engine: the one part of ``sailor_core`` that imports torch.

The package itself imports nothing heavy: ``layout`` and ``agent`` must stay
importable without torch (the orchestrator uses them on machines that only
launch workers).  Torch-using modules are imported explicitly, e.g.
``from sailor_core.runtime.launch import launch_local``.
"""
