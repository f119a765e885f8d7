"""``sailor profile``'s settings (a model's layers on this machine) and ``sailor profile
network``'s, which are also the network-profile flow's parameters."""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.specs.fields import SpecError, option, positive


def positive_ints(text: str) -> tuple[int, ...]:
    """``1,2,4``: comma-separated positive integers (ValueError says why not)."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"must be comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"must be comma-separated positive integers, got {text!r}")
    return values


def _at_least_one(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise SpecError(name, f"must be >= 1, got {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSpec:
    """What ``sailor profile`` measures: the model's layers for each micro-batch size x TP degree."""

    model: str | None = option(None, help="catalog model name (e.g. tiny, small, opt-350m)")
    micro_batch_sizes: tuple[int, ...] = option((1,), help="micro-batch sizes, comma-separated (e.g. 1,2,4)",
                                                cli=("--mbs",), parse=positive_ints)
    tp_degrees: tuple[int, ...] = option((1,), help="TP degrees, comma-separated (e.g. 1,2)", cli=("--tp",),
                                         parse=positive_ints)
    device: str = option("cpu", help="cpu or cuda")
    gpu: str | None = option(None, help="catalog GPU type to file a CUDA profile under (default: from the device name)")
    threads: int = option(1, help="intra-op threads per rank (the engine's default is 1)")
    seq_len: int | None = option(None, help="tokens per sequence (default: the model's)")
    reps: int = option(10, help="timed repetitions per layer (after 2 warm-ups)")
    timer: str = option("wall", help="wall, or cpu: process CPU time (CPU, TP 1; robust on a machine shared with "
                                     "other jobs)")
    measure_overhead: bool = option(True, help="also measure the framework's constant memory per process",
                                    cli=("--overhead/--no-overhead",))
    save: bool = option(True, help="write the profiles to your profiles folder", cli=("--save/--no-save",))

    def __post_init__(self) -> None:
        _at_least_one("reps", self.reps)


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkProfileSpec:
    """What ``sailor profile network`` and the network-profile flow measure: p2p and all-reduce
    among ``workers`` (local processes, or instances of ``gpu`` in ``zone``, rank 1 in ``dst_zone``)."""

    workers: int = option(2, help="workers: local processes, or cloud instances (p2p uses two, all-reduce all)")
    reps: int = option(5, help="repetitions per message size (more for small ones)")
    max_mib: int | None = option(None, help="largest message in MiB (sizes 64 KiB x 4^k; default 256, 16 on the "
                                            "embedded cloud)")
    device: str | None = option(None, help="cpu (gloo) or cuda (nccl); default cpu locally, cuda on real clouds")
    gpu: str | None = option(None, help="GPU type of the instances (with --cloud)")
    zone: str | None = option(None, help="zone of the instances / of rank 0 (with --cloud)")
    dst_zone: str | None = option(None, help="zone of rank 1: measure a cross-zone link")
    spot: bool = option(True, help="rent spot instances (with --cloud)", cli=("--spot/--no-spot",),
                        off_aliases=("--on-demand",))
    budget_usd: float = option(5.0, help="refuse to start when the instances could cost more if run to the "
                                         "deadlines (with --cloud)")
    timeout_s: float = option(600.0, help="deadline for the measurement once the instances run (with --cloud)")
    save: bool | None = option(None, help="write the fit to your network folder (default: yes, but not from the "
                                          "embedded cloud)", cli=("--save/--no-save",))

    def __post_init__(self) -> None:
        _at_least_one("reps", self.reps)
        _at_least_one("max_mib", self.max_mib)
        if self.device is not None and self.device not in ("cpu", "cuda"):
            raise SpecError("device", f"must be cpu or cuda, got {self.device!r}")
        positive("timeout_s", self.timeout_s)
