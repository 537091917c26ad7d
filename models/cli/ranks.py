"""What every command that runs as several ranks shares (``finetune``, ``pretrain``, ``dpo``,
``generate``, ``serve`` with ``--nproc N``): the chip --device names, the device a rank takes,
and the checks made before Paddle's launcher starts the ranks."""

from __future__ import annotations

from ..training import distributed


def chip_of(device: str | None) -> str:
    """The chip ``device`` names (the default device's when None), without an index."""
    from anychip.selection import default_device

    return (device or default_device()).partition(":")[0]


def rank_device(device: str | None) -> str | None:
    """The device this process takes: ``device`` itself, or in a rank of a launched job the
    chip's device of the rank's index (the host, ``cpu``, for every rank)."""
    if not distributed.launched():
        return device
    chip = chip_of(device)
    return chip if chip == "cpu" else f"{chip}:{distributed.rank()}"


def launch(device: str | None, argv: list[str], nproc: int) -> int:
    """Runs the command ``argv`` as ``nproc`` ranks on --device's chip (rank r on device r) and
    returns their exit status, refusing first a --device that names one device, or a chip with
    fewer devices than ranks or without collectives."""
    if ":" in (device or ""):
        raise ValueError(f"--device {device} names one device; with --nproc {nproc} rank r takes device r of the "
                         "chip: pass the chip alone (e.g. --device npu)")
    chip = chip_of(device)
    if chip != "cpu":
        _require_ranks(chip, nproc)
    return distributed.launch(argv, nproc, chip)


def _require_ranks(chip: str, nproc: int) -> None:
    from anychip.devices import describe
    from anychip.runtime import open_runtime
    from anychip.runtime.collectives import require_collectives

    info = describe(chip)
    if info.count < nproc:
        more = " (a simulated chip has ANYCHIP_SIM_DEVICES of them)" if info.status == "simulated" else ""
        raise ValueError(f"--nproc {nproc} on {chip}: rank r takes {chip}:r, and {chip} has {info.count} "
                         f"device(s){more}")
    require_collectives(open_runtime(chip))
