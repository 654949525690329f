"""Same-device weight handoff: a trainer and its servers on one device (the CPU demo; one GPU
shared with `trainer.share_inference_gpus`) hand weights over without a collective.

The trainer owns one flat segment holding every parameter, each at its `segment_layout`
offset: a file under /dev/shm mapped by both sides on CPU (`weights/segments.py` names it for the
run), a CUDA allocation shared through its IPC handle on a GPU. Per update it writes its
parameters into the segment (waiting for the device), then POSTs `/request_weight_update` with
the parameter list and the segment's descriptor (`SegmentDescriptor`, docs/ARCHITECTURE.md).
The server maps the segment once (outside any pause), and per update pauses decoding only for
a device-local copy from the segment into its weights, sets the version and resumes: KV caches
are kept and per-token versions stay exact, as with the process group (`weights/sync.py`).

Neither side waits on the other inside a collective: the server reads a segment the trainer
finished writing before it asked, so a trainer that dies leaves the server serving, and a server
that dies fails the trainer's HTTP request at once. The trainer unlinks the segment's name as soon
as every server answered (`weights/segments.py` says what removes a leftover).
"""

from __future__ import annotations

import base64
import mmap
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

import torch

from rl_core.models.model_io import dtype_name, synchronize_device, torch_dtype
from rl_core.weights.segments import SEGMENT_DIR, check_segment_name, segment_name
from rl_core.weights.sync import (
    HttpWeightSyncEndpoint,
    ParamSpec,
    UpdatableEngine,
    _raise_first,
    _run_all,
    parse_update,
    update_metrics,
)

HandoffKind = Literal["shared_memory", "cuda_ipc"]
SEGMENT_ALIGN_BYTES = 256  # every parameter starts on this boundary (any dtype's view, coalesced CUDA copies)


def segment_layout(specs: list[ParamSpec]) -> tuple[list[int], int]:
    """Byte offset of every parameter in the segment, and the segment's size. Deterministic:
    trainer and server compute it from the same parameter list."""
    offsets, cursor = [], 0
    for spec in specs:
        offsets.append(cursor)
        nbytes = spec.numel * torch_dtype(spec.dtype).itemsize
        cursor += (nbytes + SEGMENT_ALIGN_BYTES - 1) // SEGMENT_ALIGN_BYTES * SEGMENT_ALIGN_BYTES
    return offsets, max(cursor, SEGMENT_ALIGN_BYTES)


def segment_view(buffer: torch.Tensor, spec: ParamSpec, offset: int) -> torch.Tensor:
    """Parameter `spec` inside the flat uint8 `buffer`, as its dtype and shape."""
    nbytes = spec.numel * torch_dtype(spec.dtype).itemsize
    return buffer[offset : offset + nbytes].view(torch_dtype(spec.dtype)).view(spec.shape)


# ------------------------------------------------------------------ the descriptor (wire)

# The fields torch's own CUDA IPC reduction (torch.multiprocessing.reductions.reduce_tensor)
# sends for a storage, in `rebuild_cuda_tensor`'s order after the tensor's dtype.
_CUDA_IPC_FIELDS = ("device", "handle", "storage_size_bytes", "storage_offset_bytes", "ref_counter_handle",
                    "ref_counter_offset", "event_handle", "event_sync_required")
_CUDA_IPC_BYTES = {"handle", "ref_counter_handle", "event_handle"}


@dataclass(frozen=True)
class SegmentDescriptor:
    """Where a server finds the segment: `kind` shared_memory (`name`: its file under /dev/shm)
    or cuda_ipc (`cuda_ipc`: the allocation's IPC handle, bytes as base64); `nbytes` its size;
    `name` (numbered per trainer, never reused) also identifies a CUDA segment, so a server maps
    each segment once."""

    kind: HandoffKind
    name: str
    nbytes: int
    cuda_ipc: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "name": self.name, "nbytes": self.nbytes}
        if self.kind == "cuda_ipc":
            data["cuda_ipc"] = self.cuda_ipc
        return data

    @classmethod
    def from_json(cls, data: Any) -> SegmentDescriptor:
        """ValueError naming the field (`segment.<field>`) for anything a server cannot map."""
        if not isinstance(data, dict):
            raise ValueError("segment: must be an object {kind, name, nbytes[, cuda_ipc]}")
        kind = data.get("kind")
        if kind not in ("shared_memory", "cuda_ipc"):
            raise ValueError(f"segment.kind: must be 'shared_memory' or 'cuda_ipc', got {kind!r}")
        name, nbytes = data.get("name"), data.get("nbytes")
        if not isinstance(name, str) or not name:
            raise ValueError("segment.name: must be a non-empty string")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
            raise ValueError(f"segment.nbytes: must be a positive integer, got {nbytes!r}")
        if kind == "shared_memory":
            try:
                check_segment_name(name)
            except ValueError as exc:
                raise ValueError(f"segment.name: {exc}") from None
            return cls("shared_memory", name, nbytes)
        ipc = data.get("cuda_ipc")
        if not isinstance(ipc, dict) or set(ipc) != set(_CUDA_IPC_FIELDS):
            raise ValueError(f"segment.cuda_ipc: must be an object with exactly {list(_CUDA_IPC_FIELDS)}")
        return cls("cuda_ipc", name, nbytes, dict(ipc))


def _cuda_ipc_fields(buffer: torch.Tensor) -> dict[str, Any]:
    """The IPC handle of a CUDA buffer, as JSON (torch's reduction, without pickle)."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(buffer)
    values = dict(zip(_CUDA_IPC_FIELDS, args[6:14]))
    return {key: base64.b64encode(value).decode() if key in _CUDA_IPC_BYTES and value is not None else value
            for key, value in values.items()}


def _open_cuda_ipc(fields: dict[str, Any], nbytes: int) -> torch.Tensor:
    """The trainer's CUDA buffer in this process (torch's own rebuild of a shared CUDA tensor)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    values = [base64.b64decode(fields[key]) if key in _CUDA_IPC_BYTES and fields[key] is not None else fields[key]
              for key in _CUDA_IPC_FIELDS]
    return rebuild_cuda_tensor(torch.Tensor, torch.Size([nbytes]), (1,), 0, torch.storage.TypedStorage, torch.uint8,
                               *values[:4], False, *values[4:])


# ------------------------------------------------------------------ trainer side


class SharedSegment:
    """The trainer's segment: `buffer` (flat uint8 on `device`) and its `descriptor`."""

    def __init__(self, nbytes: int, device: torch.device, tag: str) -> None:
        self.device = device
        self.path = None
        self._mapping: mmap.mmap | None = None
        if device.type == "cuda":
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
            name = segment_name(tag)  # a CUDA segment has no file: the name only identifies it
            self.descriptor = SegmentDescriptor("cuda_ipc", name, nbytes, _cuda_ipc_fields(self.buffer))
            return
        if device.type != "cpu":
            raise ValueError(f"a same-device handoff needs a cpu or cuda device, got {device}")
        name = segment_name(tag)
        self.path = SEGMENT_DIR / name
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self._mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                                      mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            self.unlink_name()
            raise
        finally:
            os.close(fd)
        self.buffer = torch.frombuffer(self._mapping, dtype=torch.uint8)
        self.descriptor = SegmentDescriptor("shared_memory", name, nbytes)

    def unlink_name(self) -> None:
        """Remove the segment's name; the mappings (ours, the servers') stay valid."""
        if self.path is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self.unlink_name()
        self.buffer = torch.empty(0, dtype=torch.uint8)
        if self._mapping is not None:
            mapping, self._mapping = self._mapping, None
            try:
                mapping.close()
            except BufferError:  # a view still exported: the mapping goes with it
                pass


class SameDeviceSender:
    """Trainer side of the handoff, shaped like `WeightBroadcaster`: `connect()`,
    `broadcast(named_tensors, version)` per update (the figures of the update), `close()`."""

    def __init__(self, server_urls: list[str], segment_tag: str, device: str | torch.device = "cpu",
                 timeout_s: float = 300.0, endpoints: list[HttpWeightSyncEndpoint] | None = None) -> None:
        self.endpoints = list(endpoints or []) + [HttpWeightSyncEndpoint(url, timeout_s=timeout_s) for url in server_urls]
        if not self.endpoints:
            raise ValueError("SameDeviceSender needs at least one server")
        self.segment_tag = segment_tag
        self.device = torch.device(device)
        self.segment: SharedSegment | None = None
        self._layout: tuple[list[ParamSpec], list[int]] | None = None

    def connect(self) -> None:
        """Nothing to join: the segment is made at the first update, when its size is known."""

    def _segment_for(self, specs: list[ParamSpec], device: torch.device) -> tuple[SharedSegment, list[int]]:
        offsets, nbytes = segment_layout(specs)
        if self.segment is None or self._layout is None or self._layout[0] != specs or self.segment.device != device:
            if self.segment is not None:
                self.segment.close()
            self.segment = SharedSegment(nbytes, device, self.segment_tag)
            self._layout = (specs, offsets)
        return self.segment, offsets

    def broadcast(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        items = [(name, tensor.detach()) for name, tensor in named_tensors]
        specs = [ParamSpec(name, dtype_name(tensor.dtype), tuple(tensor.shape)) for name, tensor in items]
        device = items[0][1].device if items and items[0][1].device.type == "cuda" else self.device
        started = time.perf_counter()
        segment, offsets = self._segment_for(specs, device)
        with torch.no_grad():
            for (_, tensor), spec, offset in zip(items, specs, offsets):
                segment_view(segment.buffer, spec, offset).copy_(tensor)
        # The servers read the segment as soon as they are asked: the writes must be done.
        synchronize_device(device)
        write_s = time.perf_counter() - started
        names = [endpoint.name for endpoint in self.endpoints]
        descriptor = segment.descriptor
        calls = [(endpoint.name, lambda endpoint=endpoint: endpoint.request_segment_update(version, specs, descriptor))
                 for endpoint in self.endpoints]
        threads, results, errors = _run_all(calls)
        try:
            for thread in threads:
                thread.join()
        finally:
            # Every server that was going to map the segment has (or has failed): its name goes.
            segment.unlink_name()
        _raise_first(names, errors)
        return update_metrics(results, started, version, same_device=True, **{"weights/handoff_write_s": write_s})

    def close(self) -> None:
        for endpoint in self.endpoints:
            endpoint.close()
        if self.segment is not None:
            segment, self.segment = self.segment, None
            segment.close()


# ------------------------------------------------------------------ server side


class AttachedSegment:
    """A trainer's segment mapped in a server: `buffer`, flat uint8 on the server's device."""

    def __init__(self, descriptor: SegmentDescriptor, device: torch.device) -> None:
        self.descriptor = descriptor
        self._mapping: mmap.mmap | None = None
        if descriptor.kind == "cuda_ipc":
            if device.type != "cuda":
                raise ValueError(f"segment.kind: 'cuda_ipc' needs a server on CUDA, this one is on {device}")
            self.buffer = _open_cuda_ipc(descriptor.cuda_ipc, descriptor.nbytes)
            if self.buffer.device != device:
                raise ValueError(f"segment.cuda_ipc: the trainer's buffer is on {self.buffer.device}, this server on {device}")
            return
        if device.type != "cpu":
            raise ValueError(f"segment.kind: 'shared_memory' needs a server on CPU, this one is on {device}")
        path = check_segment_name(descriptor.name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise ValueError(f"segment.name: cannot open {path} ({exc.strerror}); a same-device handoff needs the trainer "
                             "on this server's node (inference.weight_handoff)") from None
        try:
            if os.fstat(fd).st_size < descriptor.nbytes:
                raise ValueError(f"segment.nbytes: {descriptor.nbytes} but {path} holds {os.fstat(fd).st_size} bytes")
            # MAP_POPULATE: the pages are mapped now, not faulted in one by one inside the first pause.
            self._mapping = mmap.mmap(fd, descriptor.nbytes, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), mmap.PROT_READ)
        finally:
            # The name stays: the other servers of the run map the same segment; the trainer
            # unlinks it once every server has answered.
            os.close(fd)
        with warnings.catch_warnings():  # read-only mapping: this side never writes it
            warnings.simplefilter("ignore", UserWarning)
            self.buffer = torch.frombuffer(self._mapping, dtype=torch.uint8)

    def close(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)
        if self._mapping is not None:
            mapping, self._mapping = self._mapping, None
            try:
                mapping.close()
            except BufferError:
                pass


class SegmentReceiver:
    """Server side: on a `/request_weight_update` that carries a segment, map it (once per
    segment, before pausing), then pause the engine for the copy into its weights."""

    def __init__(self, engine: UpdatableEngine) -> None:
        self.engine = engine
        self.attached: AttachedSegment | None = None
        self._lock = threading.Lock()

    def receive(self, version: int, raw_params: list[dict[str, Any]], raw_segment: Any) -> float:
        """Take one update from the trainer's segment; returns the engine pause in seconds.
        ValueError (nothing changed) for a parameter list or segment this server cannot take."""
        descriptor = SegmentDescriptor.from_json(raw_segment)
        specs, problem = parse_update(raw_params, self.engine.check_update)
        if problem is not None:
            raise ValueError(f"params: {problem}")
        offsets, nbytes = segment_layout(specs)
        if nbytes > descriptor.nbytes:
            raise ValueError(f"segment.nbytes: {descriptor.nbytes} bytes cannot hold these params ({nbytes} bytes)")
        with self._lock:
            segment = self._attach(descriptor)
            targets = [self.engine.tensor_by_name(spec.name) for spec in specs]
            sources = [segment_view(segment.buffer, spec, offset) for spec, offset in zip(specs, offsets)]
            with self.engine.paused() as pause, torch.no_grad():
                for target, source in zip(targets, sources):
                    target.copy_(source)
                self.engine.set_version(version)
            return self.engine.record_update(pause.pause_s)

    def _attach(self, descriptor: SegmentDescriptor) -> AttachedSegment:
        if self.attached is not None and self.attached.descriptor == descriptor:
            return self.attached
        if self.attached is not None:  # the trainer made a new segment (restarted, or other params)
            self.attached.close()
            self.attached = None
        self.attached = AttachedSegment(descriptor, self.engine.device)
        return self.attached
