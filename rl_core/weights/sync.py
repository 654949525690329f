"""In-flight weight updates: trainer (rank 0) -> inference servers (ranks 1..N).

Protocol (docs/ARCHITECTURE.md): the trainer POSTs `/init_process_group` to
every server once, then per update POSTs `/request_weight_update` with the
ordered parameter list to all servers concurrently and broadcasts the tensors
over a torch.distributed group. Both sides cut the list into the same buckets
(`plan_buckets`: consecutive parameters of one dtype, about `bucket_bytes`
each), so one collective moves many parameters and the receiver knows where
every slice belongs.

The group is built directly on a TCPStore (gloo on CPU, NCCL on GPU, same
code) rather than through `init_process_group`, so it never touches the
default group a DeepSpeed trainer uses for its own data parallelism.

Per-server calls sit behind `WeightSyncEndpoint`; `HttpWeightSyncEndpoint`
speaks the HTTP contract (reference engine, vLLM with the same routes).

The receiving side of the protocol is written once, here: `check_join` (which rank and
backend a server may take), `parse_update` (the parameter list and whether this server
refuses it), `SyncGroup.handshake` (the go/no-go vote) and `receive_buckets` (the buckets in
order). The reference server's `WeightReceiver` and the vLLM workers' transfer engine
(`inference/vllm_plugin.py`) differ only in where a received bucket goes.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

import httpx
import torch
import torch.distributed as dist

from rl_core.models.model_io import dtype_name, synchronize_device, torch_dtype
from rl_core.common.processes import free_port
from rl_core.common.metric_names import WEIGHTS_VERSION
from rl_core.rundir.layout import ADVERTISED_ADDRESS_ENV  # where the TCPStore listens on a cluster

DEFAULT_BUCKET_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class ParamSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: Any) -> ParamSpec:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError(f"params entries need name/dtype/shape, got {data!r}")
        shape = data.get("shape")
        if not isinstance(shape, list) or not all(isinstance(size, int) and size >= 0 for size in shape):
            raise ValueError(f"param {data['name']!r}: shape must be a list of non-negative ints")
        torch_dtype(str(data.get("dtype")))
        return cls(data["name"], str(data["dtype"]).removeprefix("torch."), tuple(shape))


@dataclass
class Bucket:
    dtype: str
    members: list[tuple[int, int, int]]  # (index into the param list, offset, numel)
    numel: int


def plan_buckets(specs: list[ParamSpec], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """Consecutive same-dtype parameters packed into flat buckets of about `bucket_bytes`
    (a larger parameter gets a bucket of its own). Deterministic: sender and receiver
    compute it from the same list."""
    buckets: list[Bucket] = []
    for index, spec in enumerate(specs):
        item_bytes = torch.empty((), dtype=torch_dtype(spec.dtype)).element_size()
        current = buckets[-1] if buckets else None
        if current is None or current.dtype != spec.dtype or (current.numel + spec.numel) * item_bytes > bucket_bytes:
            current = Bucket(spec.dtype, [], 0)
            buckets.append(current)
        current.members.append((index, current.numel, spec.numel))
        current.numel += spec.numel
    return buckets


@dataclass
class SyncGroup:
    """The process group(s) of one weight group and the TCPStore they rendezvoused through
    (kept alive together). `groups` are the group's *streams*: bucket k goes over stream
    k % len(groups), so several buckets are on the wire at once. Each gloo group is its own set
    of TCP connections; one connection is bound by one core's packet work, so across a network
    interface a second stream moves the same bytes faster (bench/multinode.py). Stream 0 also
    carries the go/no-go handshake."""

    groups: list[dist.ProcessGroup]
    store: dist.TCPStore

    @property
    def streams(self) -> int:
        return len(self.groups)

    def agree(self, refuse: bool, device: torch.device) -> Any:
        """Start the go/no-go handshake of an update: every rank adds 1 if it refuses.
        Returns (work, flag); after `work.wait()`, `flag.item() > 0` means someone refused."""
        flag = torch.tensor([1 if refuse else 0], dtype=torch.int32, device=device)
        return self.groups[0].allreduce([flag]), flag

    def handshake(self, refuse: bool, device: torch.device) -> int:
        """A receiver's vote in the go/no-go handshake, waited for: how many ranks refused
        (this one included). The trainer votes through `agree` and polls instead."""
        work, flag = self.agree(refuse, device)
        work.wait()
        return int(flag.item())

    def broadcast(self, tensor: torch.Tensor, number: int = 0) -> Any:
        """Start the broadcast of bucket `number` from rank 0 on its stream; returns the
        collective's work handle. Every rank sends bucket k on the same stream, in the same order."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return self.groups[number % len(self.groups)].broadcast([tensor], options)

    def shutdown(self) -> None:
        """Release the backend's resources now (a process group has no close of its own
        everywhere; an older torch without `shutdown` frees it with the object)."""
        for group in self.groups:
            shutdown = getattr(group, "shutdown", None)
            if shutdown is not None:
                try:
                    shutdown()
                except RuntimeError:
                    pass


MAX_STREAMS = 8


def default_streams(backend: str) -> int:
    """Streams of a weight group when the run config leaves it unset: two TCP connections for
    gloo (RESULTS.md: the broadcast across a veth 1.35x faster, on loopback 1.3x), one for NCCL
    (its communicator already spreads a collective over several channels and sockets)."""
    return 2 if backend == "gloo" else 1


def create_group(
    backend: str, master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float = 300.0,
    streams: int = 1,
) -> SyncGroup:
    """A weight group of its own on a TCPStore hosted by rank 0 (the trainer): `streams`
    process groups of `backend`, each rendezvousing under its own prefix of the one store."""
    if not 1 <= streams <= MAX_STREAMS:
        raise ValueError(f"streams must be 1..{MAX_STREAMS}, got {streams}")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_address, master_port, world_size, is_master=(rank == 0), timeout=timeout)
    groups: list[dist.ProcessGroup] = []
    for stream in range(streams):
        # Stream 0 keeps the bare store: a group of one stream rendezvouses exactly as before.
        stream_store = store if stream == 0 else dist.PrefixStore(f"stream{stream}", store)
        if backend == "gloo":
            groups.append(dist.ProcessGroupGloo(stream_store, rank, world_size, timeout))
        elif backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            groups.append(dist.ProcessGroupNCCL(stream_store, rank, world_size, options))
        else:
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    return SyncGroup(groups, store)


# ------------------------------------------------------------------ trainer side


class WeightSyncEndpoint(Protocol):
    """One inference server as the broadcaster sees it."""

    name: str

    def init_process_group(self, master_address: str, master_port: int, rank: int, world_size: int, backend: str, group_name: str,
                           streams: int = 1) -> None: ...

    def request_weight_update(self, version: int, params: list[ParamSpec], bucket_bytes: int) -> dict[str, Any]:
        """Blocks until the server has received and swapped in the weights."""
        ...

    def close(self) -> None: ...


class WeightSyncError(RuntimeError):
    pass


class HttpWeightSyncEndpoint:
    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.name = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.name, timeout=timeout_s, trust_env=False)

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._http.post(route, json=body)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"server {self.name}{route} unreachable: {exc!r}") from exc
        if response.status_code != 200:
            raise WeightSyncError(f"server {self.name}{route} answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def group_ranks(self) -> int:
        """Ranks this server takes in the group (`weight_sync_ranks` in /health; 1 if absent)."""
        try:
            health = self._http.get("/health").json()
        except (httpx.HTTPError, ValueError) as exc:
            raise WeightSyncError(f"server {self.name}/health unreachable: {exc!r}") from exc
        return max(1, int(health.get("weight_sync_ranks", 1)))

    def init_process_group(self, master_address: str, master_port: int, rank: int, world_size: int, backend: str, group_name: str,
                           streams: int = 1) -> None:
        self._post(
            "/init_process_group",
            {"master_address": master_address, "master_port": master_port, "rank": rank,
             "world_size": world_size, "backend": backend, "group_name": group_name, "streams": streams},
        )

    def request_weight_update(self, version: int, params: list[ParamSpec], bucket_bytes: int) -> dict[str, Any]:
        return self._post(
            "/request_weight_update",
            {"version": version, "params": [spec.to_json() for spec in params], "bucket_bytes": bucket_bytes},
        )

    def request_segment_update(self, version: int, params: list[ParamSpec], segment: Any) -> dict[str, Any]:
        """A same-device update (`weights/handoff.py`): the weights are in `segment` (its descriptor)."""
        return self._post(
            "/request_weight_update",
            {"version": version, "params": [spec.to_json() for spec in params], "segment": segment.to_json()},
        )

    def close(self) -> None:
        self._http.close()


def _run_all(calls: list[tuple[str, Any]]) -> tuple[list[threading.Thread], list[Any], list[BaseException | None]]:
    """Start one thread per (name, callable); results/errors are filled in as they finish."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def runner(index: int, call: Any) -> None:
        try:
            results[index] = call()
        except BaseException as exc:  # reported by the caller with the server named
            errors[index] = exc

    threads = [threading.Thread(target=runner, args=(i, call), daemon=True) for i, (_, call) in enumerate(calls)]
    for thread in threads:
        thread.start()
    return threads, results, errors


def _raise_first(names: list[str], errors: list[BaseException | None]) -> None:
    for name, error in zip(names, errors):
        if error is not None:
            raise WeightSyncError(f"weight sync with {name} failed: {error}") from error


def update_metrics(results: list[Any], started: float, version: int, same_device: bool, **timings: float) -> dict[str, float]:
    """One update's metric line, the same from either path (process group or same-device handoff):
    the longest pause a server reported, the path's own timings, the whole update's time."""
    pauses = [float(result.get("pause_s", 0.0)) for result in results]
    return {
        "weights/update_pause_s": max(pauses),
        **timings,
        "weights/update_total_s": time.perf_counter() - started,
        WEIGHTS_VERSION: float(version),
        "weights/same_device_handoff": 1.0 if same_device else 0.0,
    }


class WeightBroadcaster:
    """Trainer side: `connect()` once, `broadcast(named_tensors, version)` per update, `close()`."""

    def __init__(
        self,
        server_urls: list[str] | None = None,
        backend: str = "gloo",
        master_address: str | None = None,
        master_port: int | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        endpoints: list[WeightSyncEndpoint] | None = None,
        timeout_s: float = 300.0,
        device: str | torch.device | None = None,
        streams: int | None = None,
    ) -> None:
        self.endpoints: list[WeightSyncEndpoint] = list(endpoints or []) + [HttpWeightSyncEndpoint(url) for url in server_urls or []]
        if not self.endpoints:
            raise ValueError("WeightBroadcaster needs at least one server")
        self.backend = backend
        # The servers connect to the trainer's TCPStore: on a cluster the launcher puts the
        # address of the trainer's node in its environment; one node: localhost.
        self.master_address = master_address or os.environ.get(ADVERTISED_ADDRESS_ENV) or "127.0.0.1"
        self.master_port = master_port
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.streams = streams or default_streams(backend)
        if not 1 <= self.streams <= MAX_STREAMS:
            raise ValueError(f"streams must be 1..{MAX_STREAMS}, got {self.streams}")
        # Where buckets are assembled: gloo moves host memory, so CPU (a CUDA trainer's
        # tensors are copied out bucket by bucket); nccl sends them from where they are.
        if device is None and backend == "gloo":
            device = "cpu"
        self.device = None if device is None else torch.device(device)
        self.group: SyncGroup | None = None

    def connect(self) -> None:
        port = self.master_port or free_port(self.master_address)
        # A server may hold several ranks (a vLLM server: one per tensor-parallel worker);
        # it is told its first rank and takes the ones after it.
        ranks_per_endpoint = [int(getattr(endpoint, "group_ranks", lambda: 1)()) for endpoint in self.endpoints]
        first_ranks = [1 + sum(ranks_per_endpoint[:index]) for index in range(len(self.endpoints))]
        world_size = 1 + sum(ranks_per_endpoint)
        names = [endpoint.name for endpoint in self.endpoints]
        calls = [
            (endpoint.name, lambda endpoint=endpoint, rank=rank: endpoint.init_process_group(
                self.master_address, port, rank, world_size, self.backend, "inflight-weights", self.streams))
            for rank, endpoint in zip(first_ranks, self.endpoints)
        ]
        threads, _, errors = _run_all(calls)
        # Rendezvous in a thread of its own: it blocks until every server has joined, and a
        # server that refused must surface as its error now, not as a store timeout later.
        own = _run_all([("trainer", lambda: create_group(self.backend, self.master_address, port, 0, world_size, self.timeout_s, self.streams))])
        deadline = time.monotonic() + self.timeout_s
        while own[0][0].is_alive():
            _raise_first(names, errors)
            if time.monotonic() > deadline:
                raise WeightSyncError(f"process group rendezvous on {self.master_address}:{port} timed out")
            own[0][0].join(0.05)
        _raise_first(["trainer"], own[2])
        for thread in threads:
            thread.join(self.timeout_s)
        _raise_first(names, errors)
        self.group = own[1][0]
        self.master_port = port

    def broadcast(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        if self.group is None:
            raise WeightSyncError("connect() first")
        items = [(name, tensor.detach()) for name, tensor in named_tensors]
        specs = [ParamSpec(name, dtype_name(tensor.dtype), tuple(tensor.shape)) for name, tensor in items]
        names = [endpoint.name for endpoint in self.endpoints]
        started = time.perf_counter()
        calls = [
            (endpoint.name, lambda endpoint=endpoint: endpoint.request_weight_update(version, specs, self.bucket_bytes))
            for endpoint in self.endpoints
        ]
        threads, results, errors = _run_all(calls)
        # Handshake first: a server that refuses the update (unknown name, wrong shape)
        # says so inside the group, so nobody is left waiting in a half-matched broadcast
        # and the group stays usable for the next update.
        device = self.device or (items[0][1].device if items else torch.device("cpu"))
        work, refusals = self.group.agree(False, device)
        self._wait(work, names, errors)
        if int(refusals.item()) > 0:
            for thread in threads:
                thread.join(self.timeout_s)
            _raise_first(names, errors)
            raise WeightSyncError(f"{int(refusals.item())} server(s) refused the update to version {version}")
        broadcast_started = time.perf_counter()
        in_flight: list[tuple[Any, torch.Tensor]] = []  # (work, flat): `flat` kept alive until sent
        for number, bucket in enumerate(plan_buckets(specs, self.bucket_bytes)):
            # Assemble the next bucket while the previous ones are on the wire, one per stream.
            flat = torch.cat([items[index][1].reshape(-1) for index, _, _ in bucket.members])
            if self.device is not None:
                flat = flat.to(self.device)
            while len(in_flight) >= self.group.streams:
                self._wait(in_flight.pop(0)[0], names, errors)
            in_flight.append((self.group.broadcast(flat, number), flat))
        for work, _ in in_flight:
            self._wait(work, names, errors)
        synchronize_device(self.device or device)
        broadcast_s = time.perf_counter() - broadcast_started
        for thread in threads:
            thread.join(self.timeout_s)
        _raise_first(names, errors)
        return update_metrics(results, started, version, same_device=False, **{"weights/broadcast_s": broadcast_s})

    def _wait(self, work: Any, names: list[str], errors: list[BaseException | None]) -> None:
        # Poll rather than block: a server that died or failed never joins the collective,
        # and its HTTP error should surface now, not after the group timeout. The deadline is
        # kept here, outside the collective: a peer on a machine that vanished (no reset, no
        # HTTP error, only silence) ends the update with an error naming the servers, not a hang.
        deadline = time.monotonic() + self.timeout_s
        while not work.is_completed():
            _raise_first(names, errors)
            if time.monotonic() > deadline:
                raise WeightSyncError(f"weight update not completed by {', '.join(names)} within {self.timeout_s:.0f} s "
                                      "(a server or its node stopped answering)")
            time.sleep(0.0005)
        work.wait()

    def close(self) -> None:
        for endpoint in self.endpoints:
            endpoint.close()
        if self.group is not None:
            group, self.group = self.group, None
            group.shutdown()


# ------------------------------------------------------------------ server side


def check_join(rank: int, world_size: int, backend: str, on_cuda: bool, ranks: int = 1, what: str = "an engine") -> None:
    """Refuse a join the group could not complete: this server takes `ranks` consecutive
    ranks from `rank` (the trainer is rank 0), and NCCL needs CUDA tensors."""
    if not 1 <= rank or rank + ranks > world_size:
        workers = "" if ranks == 1 else f" and this server's {ranks} workers take ranks from it"
        raise ValueError(f"rank must be in 1..world_size-{ranks} (the trainer is rank 0{workers}), got rank={rank} world_size={world_size}")
    if backend == "nccl" and not on_cuda:
        raise ValueError(f"backend 'nccl' needs {what} on CUDA; use 'gloo' on CPU")


def parse_update(raw_params: list[dict[str, Any]], check: Callable[[Iterable[tuple[str, tuple[int, ...]]]], None]) -> tuple[list[ParamSpec], str | None]:
    """The parameter list of a /request_weight_update, checked against the model by `check`.
    Returns (specs, None), or ([], why) when this server must refuse the update — it still
    votes in the handshake, so the trainer and the other servers learn it."""
    try:
        specs = [ParamSpec.from_json(item) for item in raw_params]
        check((spec.name, spec.shape) for spec in specs)
    except (ValueError, KeyError) as exc:
        return [], str(exc.args[0] if exc.args else exc)
    return specs, None


def receive_buckets(
    group: SyncGroup,
    specs: list[ParamSpec],
    bucket_bytes: int,
    into: Callable[[int, Bucket], torch.Tensor],
    deliver: Callable[[int, Bucket, torch.Tensor], None],
    overlap: bool = True,
) -> None:
    """Receive every bucket of an agreed update, in `plan_buckets` order, bucket k on stream
    k % streams. `into(number, bucket)` is the flat tensor bucket `number` lands in;
    `deliver(number, bucket, flat)` runs once it has arrived. With `overlap`, a bucket is
    delivered once the receives of the `group.streams` buckets after it were posted, so
    copying it out overlaps them on the wire: `into` must then hand out a buffer that is not
    one of the last `group.streams` buckets' (`group.streams + 1` buffers in turn are enough)."""
    pending: list[tuple[Any, int, Bucket, torch.Tensor]] = []
    with torch.no_grad():
        for number, bucket in enumerate(plan_buckets(specs, bucket_bytes)):
            flat = into(number, bucket)
            work = group.broadcast(flat, number)
            if not overlap:
                work.wait()
                deliver(number, bucket, flat)
                continue
            pending.append((work, number, bucket, flat))
            if len(pending) > group.streams:
                done = pending.pop(0)
                done[0].wait()
                deliver(*done[1:])
        for done in pending:
            done[0].wait()
            deliver(*done[1:])


class PauseHandle(Protocol):
    pause_s: float


class UpdatableEngine(Protocol):
    """What `WeightReceiver` needs from an engine (`engine.ReferenceEngine` is one)."""

    device: torch.device

    def check_update(self, specs: Iterable[tuple[str, tuple[int, ...]]]) -> None:
        """Raise KeyError/ValueError, touching nothing, if a name or shape does not fit."""
        ...

    def tensor_by_name(self, name: str) -> torch.Tensor: ...

    def paused(self) -> AbstractContextManager[PauseHandle]:
        """No forward pass runs inside the block; `pause_s` is set when it ends."""
        ...

    def set_version(self, version: int) -> None: ...

    def record_update(self, pause_s: float) -> float: ...


class WeightReceiver:
    """Server side: joins the group on /init_process_group, and on /request_weight_update
    pauses the engine at a step boundary, receives the buckets and copies each slice
    into the engine's tensors in place."""

    def __init__(self, engine: UpdatableEngine) -> None:
        self.engine = engine
        self.group: SyncGroup | None = None
        self.wire_device = torch.device("cpu")
        self._lock = threading.Lock()
        # Staging buffers kept from one update to the next (same model, same buckets): fresh ones
        # would be page-faulted in again inside every pause.
        self._staging: dict[tuple[str, int], list[torch.Tensor]] = {}

    def init_process_group(self, master_address: str, master_port: int, rank: int, world_size: int, backend: str,
                           timeout_s: float = 300.0, streams: int = 1) -> None:
        check_join(rank, world_size, backend, on_cuda=self.engine.device.type == "cuda")
        with self._lock:
            group = create_group(backend, master_address, master_port, rank, world_size, timeout_s, streams)
            if self.group is not None:  # a trainer that joins again (restarted) replaces its old group
                self.group.shutdown()
            self.group, self._staging = group, {}
            # gloo moves host memory: a CUDA engine receives into CPU staging and copies up.
            self.wire_device = torch.device("cpu") if backend == "gloo" else self.engine.device

    def receive(self, version: int, raw_params: list[dict[str, Any]], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> float:
        """Receive one update; returns the engine pause in seconds. Raises ValueError (and
        changes nothing) if this or another server refuses the parameter list."""
        if self.group is None:
            raise RuntimeError("no process group: POST /init_process_group first")
        with self._lock:  # one update at a time: collectives must not interleave
            return self._receive_locked(version, raw_params, bucket_bytes)

    def _receive_locked(self, version: int, raw_params: list[dict[str, Any]], bucket_bytes: int) -> float:
        assert self.group is not None
        specs, problem = parse_update(raw_params, self.engine.check_update)
        refusals = self.group.handshake(problem is not None, self.wire_device)
        if problem is not None:
            raise ValueError(f"params: {problem}")
        if refusals > 0:
            raise ValueError("another server refused this update; nothing was changed")
        targets = [self.engine.tensor_by_name(spec.name) for spec in specs]
        buckets = plan_buckets(specs, bucket_bytes)
        # A bucket that is one whole contiguous tensor of the same dtype is received in place;
        # the others land in one of streams + 1 staging buffers per dtype (sized for the largest
        # bucket), so bucket k is copied into the model while the next ones are being received.
        direct = [
            targets[b.members[0][0]] if len(b.members) == 1 and targets[b.members[0][0]].is_contiguous()
            and dtype_name(targets[b.members[0][0]].dtype) == b.dtype and targets[b.members[0][0]].device == self.wire_device
            else None
            for b in buckets
        ]
        largest: dict[str, int] = {}
        for bucket, in_place in zip(buckets, direct):
            if in_place is None:
                largest[bucket.dtype] = max(largest.get(bucket.dtype, 0), bucket.numel)
        staging = {dtype: self._staging_buffers(dtype, numel) for dtype, numel in largest.items()}

        def into(number: int, bucket: Bucket) -> torch.Tensor:
            in_place = direct[number]
            if in_place is not None:
                return in_place.data.view(-1)
            buffers = staging[bucket.dtype]
            return buffers[number % len(buffers)][: bucket.numel]

        def copy_out(number: int, bucket: Bucket, flat: torch.Tensor) -> None:
            if direct[number] is not None:
                return
            for index, offset, numel in bucket.members:
                targets[index].copy_(flat[offset : offset + numel].view(specs[index].shape))

        with self.engine.paused() as pause:
            receive_buckets(self.group, specs, bucket_bytes, into, copy_out)
            self.engine.set_version(version)
        return self.engine.record_update(pause.pause_s)

    def _staging_buffers(self, dtype: str, numel: int) -> list[torch.Tensor]:
        """`streams + 1` buffers of `numel` elements of `dtype`, the previous update's if they fit."""
        assert self.group is not None
        buffers = self._staging.get((dtype, numel))
        if buffers is None:
            self._staging = {key: value for key, value in self._staging.items() if key[0] != dtype}
            buffers = [torch.empty(numel, dtype=torch_dtype(dtype), device=self.wire_device) for _ in range(self.group.streams + 1)]
            self._staging[(dtype, numel)] = buffers
        return buffers
