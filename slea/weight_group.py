"""A weight-transfer process group between the learner and one generation engine: both sides.

The learner (rank 0) and the engine's workers (ranks 1..n) meet on a TCPStore the learner
hosts, then the learner broadcasts the weights in flat buckets (a few large messages instead
of one per parameter). The group is built directly from a torch backend (`ProcessGroupGloo`
on CPU, `ProcessGroupNCCL` on GPU), as vLLM's `stateless_init_torch_distributed_process_group`
does, so it never touches `torch.distributed`'s default group: the vLLM worker already has one,
and so may a DeepSpeed learner. (OpenRLHF's `init_process_group` registers the extra group in
`torch.distributed`'s private `_world` instead; vLLM's `StatelessProcessGroup` + `PyNcclCommunicator`
would need vLLM on the learner side.)

Every wait has a timeout: a receiver that died or never joins costs the sender `timeout_s`,
never a hang. The group is warmed up when it is made, by a one-element broadcast on both sides
(as vLLM's PyNcclCommunicator does: vllm/distributed/device_communicators/pynccl.py, "A small
all_reduce for warmup"), so NCCL creates its communicator at join time, where a receiver that
never joins fails the join, and not inside the first weight broadcast. The NCCL communicator is
non-blocking (`config.blocking = 0`): its creation and every collective return control to torch,
which gives up after `TORCH_NCCL_NONBLOCKING_TIMEOUT` and the op timeout, where a blocking
communicator would wait for a dead peer for ever. A link given up on is aborted, not shut down
(shutdown waits for the ops in flight, which a dead peer never finishes).

On GPU the sender broadcasts on a CUDA stream of its own: a collective makes the stream it is
issued from wait for the receiver, and issued from the default stream it would hold up the
training step's kernels for as long as the slowest receiver takes.

Plan, shared by both sides and sent as plain data: a list of buckets, each
`{"dtype": "float32", "tensors": [[name, [shape...]], ...]}`. Tied parameters (the same storage
under two names, e.g. `lm_head.weight` = `embed_tokens.weight`) go once; the receiver ties them.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 256 * 2**20


def backend_for(device: torch.device | str) -> str:
    """NCCL between GPUs, gloo between CPUs: both sides must pick the same."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_buckets(
    state_dict: dict[str, torch.Tensor], dtype: torch.dtype | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[dict]:
    """Group the (deduplicated) tensors into buckets of one dtype and at most `bucket_bytes`
    each (a larger tensor gets a bucket of its own). `dtype`: send everything in it (the
    engine's dtype), else each tensor's own."""
    buckets, seen = [], set()
    current, current_bytes = None, 0
    for name, tensor in state_dict.items():
        if tensor.data_ptr() in seen:  # tied: the receiver's model ties it again
            continue
        seen.add(tensor.data_ptr())
        target = dtype or tensor.dtype
        size = tensor.numel() * target.itemsize
        if current is None or current["dtype"] != dtype_name(target) or current_bytes + size > bucket_bytes:
            current, current_bytes = {"dtype": dtype_name(target), "tensors": []}, 0
            buckets.append(current)
        current["tensors"].append([name, list(tensor.shape)])
        current_bytes += size
    return buckets


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def bucket_numel(bucket: dict) -> int:
    return sum(_numel(shape) for _name, shape in bucket["tensors"])


class WeightGroup:
    """One rank's end of a weight-transfer group. Rank 0 (the learner) passes `port=0` and reads
    the port it got from `.port` (use `host_store` to know it before the others join)."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        device: torch.device | str = "cpu",
    ):
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend, self.device = rank, world_size, backend, torch.device(device)
        self.timeout = timeout
        prefixed = dist.PrefixStore("slea-weights", store)
        if backend == "gloo":
            # Blocks until all ranks have connected through the store (or raises after `timeout`).
            self._group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        elif backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            options.config.blocking = 0  # non-blocking communicator: its creation can time out
            # torch reads this once per process, on the first non-blocking communicator (NCCLUtils.cpp
            # nccl_nonblocking_timeout, 30 min by default): bound the communicator's creation as well.
            os.environ.setdefault("TORCH_NCCL_NONBLOCKING_TIMEOUT", str(math.ceil(timeout_s)))
            # The watchdog's default on a timed-out op tears the whole process down; a dead peer
            # must only break this group (2 = CleanUpOnly: abort the communicator, `wait` raises).
            # Read once, by this constructor, so the process's other groups keep their setting.
            saved = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
            try:
                self._group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
            finally:
                if saved is None:
                    os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING")
                else:
                    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = saved
        else:
            raise ValueError(f"weight group backend must be 'gloo' or 'nccl', not {backend!r}")
        self._store = store  # keep the store (and, on rank 0, its server) alive with the group
        # The sender's own stream (receivers take weights while their engine is paused: no stream to spare).
        self.stream = transfer_stream(self.device) if rank == 0 else None
        try:
            with self.on_stream():
                warm_up = torch.zeros(1, device=self.device)
            self.broadcast(warm_up)  # every rank is in and the communicator exists, or this raises
        except BaseException:
            self.close(abort=True)
            raise

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` from rank 0 in place (receivers pass an empty tensor of the same size).
        Returns once the transfer is complete (or raises after the group's timeout)."""
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor, options.timeout = 0, 0, self.timeout
        with self.on_stream():
            # wait(timeout) blocks this thread until the op completes, so `tensor` outlives it.
            self._group.broadcast([tensor], options).wait(self.timeout)

    def on_stream(self):
        """The context that puts this group's copies and collectives on its own CUDA stream (no-op on CPU)."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def close(self, abort: bool = False) -> None:
        """Release the group. `abort`: the peer is dead or stalled, so do not wait for ops in flight."""
        if self._group is not None:
            release = self._group.abort if abort else self._group.shutdown
            try:
                release()
            except RuntimeError:  # already broken: nothing left to release
                pass
        self._group = self._store = None


def transfer_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A CUDA stream for a weight group's transfers on `device`, None off the GPU."""
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def host_store(host: str, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's store server on a free port of `host` only (`store.port`); the others connect with
    `join_store`. A TCPStore given a port binds every interface, so it gets a socket bound here
    instead: on one machine (host 127.0.0.1) nothing outside it can reach the store."""
    listener = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    port = listener.getsockname()[1]
    return dist.TCPStore(
        host,
        port,
        world_size,
        True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
        master_listen_fd=listener.detach(),  # the store owns the socket from here
    )


def join_store(host: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, False, timeout=timedelta(seconds=timeout_s))


@torch.no_grad()
def send_weights(group: WeightGroup, state_dict: dict[str, torch.Tensor], plan: list[dict]) -> None:
    """Rank 0: broadcast every bucket of `plan`, flattened, on the group's device."""
    for bucket in plan:
        dtype = getattr(torch, bucket["dtype"])
        with group.on_stream():  # the copies to the GPU too: nothing of the push on the training stream
            flat = torch.cat(
                [state_dict[name].detach().reshape(-1).to(group.device, dtype) for name, _ in bucket["tensors"]]
            )
        group.broadcast(flat)


@torch.no_grad()
def receive_weights(group: WeightGroup, plan: list[dict]) -> list[tuple[str, torch.Tensor]]:
    """Ranks 1..n: receive every bucket of `plan`; (name, tensor) views into the received buffers.
    Everything arrives before anything is returned, so a transfer that fails midway leaves the
    receiver's model untouched."""
    received = []
    for bucket in plan:
        flat = torch.empty(bucket_numel(bucket), dtype=getattr(torch, bucket["dtype"]), device=group.device)
        group.broadcast(flat)
        offset = 0
        for name, shape in bucket["tensors"]:
            count = _numel(shape)
            received.append((name, flat[offset : offset + count].view(shape)))
            offset += count
    return received
