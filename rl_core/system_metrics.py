"""System metrics sampled by the launcher into metrics.jsonl every few seconds.

`system/cpu_util` (whole machine, percent, psutil), `system/mem_util` (percent) and,
where NVIDIA GPUs exist, `system/gpu<i>/util` (percent) and `system/gpu<i>/mem`
(used fraction, 0..1) through NVML (`pynvml` from nvidia-ml-py). On a machine
without a GPU or without the NVIDIA driver NVML fails to initialise and only the CPU
figures are reported: no GPU is not an error.
"""

from __future__ import annotations

from typing import Any

import psutil


class SystemSampler:
    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no driver / no library / no GPU: CPU metrics only
            self._nvml = None
            self._handles = []

    @property
    def num_gpus(self) -> int:
        return len(self._handles)

    def sample(self) -> dict[str, float]:
        """CPU utilisation since the previous call, memory and GPU figures now."""
        metrics = {
            "system/cpu_util": float(psutil.cpu_percent(interval=None)),
            "system/mem_util": float(psutil.virtual_memory().percent),
        }
        for index, handle in enumerate(self._handles):
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:  # noqa: BLE001 - a GPU that fell off the bus loses its figures, not the run
                continue
            metrics[f"system/gpu{index}/util"] = float(rates.gpu)
            metrics[f"system/gpu{index}/mem"] = float(memory.used) / float(memory.total) if memory.total else 0.0
        return metrics

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nvml = None
