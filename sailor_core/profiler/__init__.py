"""The profiler: per-layer time and memory of the engine's own layers, and the network between workers.

Import-light on purpose: this package's ``__init__`` imports nothing; the torch-using modules
(``measure``, ``compute``, ``tp_worker``, ``network``) are imported by whoever runs a profile,
never by the planner or the simulator.  See ``docs/profiler.md``.

* ``compute.profile_model``: per-layer forward/backward seconds, activation bytes kept for
  backward, output bytes and optimizer-update time of ``sailor_core.runtime.model`` layers, for
  each (micro-batch size, TP degree), into ``ModelProfile``s; ``save_profiles`` writes them to the
  user's profile folder (``ProfileDB``'s format).
* ``network.profile_network``: p2p bandwidth vs message size between two workers and all-reduce
  among N, fitted to the network model's curve (``bw(x) = a x^2 + b x + c`` GB/s), saved where
  ``sailor_core.network.default_network`` reads it.
* ``overhead.idle_worker_rss_bytes``: the framework's constant memory per process.
"""
