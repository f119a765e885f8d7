"""Loaded by every engine worker that ``bench_memory_inflight.py`` starts (it puts this folder
first on PYTHONPATH): counts the bytes of live tensor storages on the CPU through a torch
dispatch mode entered for the whole process, and writes the peak at exit.  CPU torch has no
allocator statistics; this is what ``torch.cuda.max_memory_allocated`` counts on a GPU, without
the caching allocator's rounding."""

import os

_OUT = os.environ.get("SAILOR_BENCH_LIVE_TENSORS_DIR")

if _OUT:
    import atexit
    import json
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class _LiveTensors(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, int] = {}
            self.total = self.peak = 0

        def _free(self, key: int) -> None:
            self.total -= self.live.pop(key, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    st = t.untyped_storage()
                    key = st.data_ptr()
                    if key and key not in self.live:
                        self.live[key] = st.nbytes()
                        self.total += self.live[key]
                        if self.total > self.peak:
                            self.peak = self.total
                        weakref.finalize(st, self._free, key)
            return out

    _mode = _LiveTensors()
    _mode.__enter__()

    def _write() -> None:
        rank = os.environ.get("RANK", "x")
        with open(os.path.join(_OUT, f"rank{rank}.json"), "w") as fh:
            json.dump({"rank": rank, "peak_bytes": _mode.peak, "end_bytes": _mode.total}, fh)

    atexit.register(_write)
