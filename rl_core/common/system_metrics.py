"""System metrics sampled by the launcher into metrics.jsonl every few seconds.

`system/cpu_util` (whole machine, percent, psutil), `system/mem_util` (percent) and,
where NVIDIA GPUs exist, `system/gpu<i>/util` (percent) and `system/gpu<i>/mem`
(used fraction, 0..1) through NVML (`pynvml` from nvidia-ml-py). On a machine
without a GPU or without the NVIDIA driver NVML fails to initialise and only the CPU
figures are reported: no GPU is not an error.

Per process (`roles`: the launcher's children by role name, `trainer`, `server0`, `actor`, ...):
`system/proc/<role>/cpu_percent` (percent of one core, summed over the role's process tree, so a
server's or actor's helper processes count to it), `system/proc/<role>/rss_mb` (resident memory of
that tree, MiB) and, with NVML, `system/proc/<role>/gpu_mem_mb` (GPU memory its processes hold).
A role whose process has exited is left out of that sample.
"""

from __future__ import annotations

from typing import Any, Mapping

import psutil

PROC_PREFIX = "system/proc"
MIB = 1024 * 1024


def proc_metric(role: str, figure: str) -> str:
    """The metric name of one figure of one role's processes (`system/proc/<role>/<figure>`)."""
    return f"{PROC_PREFIX}/{role}/{figure}"


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

        # psutil.Process objects kept between samples: cpu_percent() measures since the previous
        # call on the same object (a fresh one reports 0.0).
        self._processes: dict[int, psutil.Process] = {}

    def _tree(self, pid: int) -> list[psutil.Process]:
        root = self._processes.get(pid) or psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
        return [self._processes.setdefault(member.pid, member) for member in members]

    def _gpu_memory_by_pid(self) -> dict[int, float]:
        used: dict[int, float] = {}
        for handle in self._handles:
            try:
                running = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:  # noqa: BLE001 - a GPU that cannot list its processes loses that figure only
                continue
            for process in running:
                if getattr(process, "usedGpuMemory", None):
                    used[process.pid] = used.get(process.pid, 0.0) + float(process.usedGpuMemory)
        return used

    def sample_processes(self, roles: Mapping[str, int]) -> dict[str, float]:
        """CPU, memory and GPU memory of each role's process tree (see the module docstring)."""
        metrics: dict[str, float] = {}
        gpu_memory = self._gpu_memory_by_pid() if self._handles else {}
        alive: set[int] = set()
        for role, pid in roles.items():
            try:
                tree = self._tree(pid)
                cpu = rss = gpu = 0.0
                for member in tree:
                    with member.oneshot():
                        cpu += member.cpu_percent(interval=None)
                        rss += member.memory_info().rss
                    gpu += gpu_memory.get(member.pid, 0.0)
                    alive.add(member.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # it exited between two samples: no figure rather than a wrong one
            metrics[proc_metric(role, "cpu_percent")] = round(cpu, 1)
            metrics[proc_metric(role, "rss_mb")] = round(rss / MIB, 1)
            if self._handles:
                metrics[proc_metric(role, "gpu_mem_mb")] = round(gpu / MIB, 1)
        self._processes = {pid: process for pid, process in self._processes.items() if pid in alive}
        return metrics

    @property
    def num_gpus(self) -> int:
        return len(self._handles)

    def sample(self, roles: Mapping[str, int] | None = None) -> dict[str, float]:
        """CPU utilisation since the previous call, memory and GPU figures now; with `roles`
        (role name → pid), each role's own figures too (`sample_processes`)."""
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
        if roles:
            metrics.update(self.sample_processes(roles))
        return metrics

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nvml = None
