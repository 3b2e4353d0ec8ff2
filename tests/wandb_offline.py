"""Read back what an offline W&B run wrote (importable as `wandb_offline`: tests/ is on the path).

An offline run keeps everything in <dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb, the log
`wandb sync` uploads: a 7-byte header, then protobuf `Record`s in LevelDB log framing (32 KiB
blocks, each chunk behind a 7-byte crc/length/type header, a record split over blocks as
first/middle/last chunks). wandb 0.31 reads it only in its Go core, so this is that framing in
Python, with wandb's own protobuf messages."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
FILE_HEADER = struct.Struct("<4sHB")  # b":W&B", magic 0xBEE1, version
CHUNK_HEADER = struct.Struct("<IHB")  # crc32c, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    ident, magic, _version = FILE_HEADER.unpack_from(data)
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B run log"
    position, pending = FILE_HEADER.size, b""
    while position + CHUNK_HEADER.size <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < CHUNK_HEADER.size:  # a block's tail too short for a header is padding
            position += left_in_block
            continue
        _crc, length, kind = CHUNK_HEADER.unpack_from(data, position)
        if kind == 0:  # zero padding up to the block's end
            position += left_in_block
            continue
        start = position + CHUNK_HEADER.size
        if start + length > len(data):  # the writer is still at it
            return
        pending += data[start : start + length]
        position = start + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def offline_run(path: Path, timeout_s: float = 30.0) -> tuple[wandb_internal_pb2.RunRecord, dict, list[dict]]:
    """(the run record, its config as a dict, every history row as a dict) of one finished run's log.

    `run.finish()` returns before wandb's core process has written the log out: wait for the exit
    record, which it writes last."""
    deadline = time.monotonic() + timeout_s
    while True:
        run, config, history, finished = None, {}, [], False
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = record.run
                config = {_key(item): json.loads(item.value_json) for item in record.run.config.update}
            elif kind == "history":
                history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
            finished = finished or kind == "exit"
        if finished:
            assert run is not None, f"{path} holds no run record"
            return run, config, history
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s} s: the run never finished"
        time.sleep(0.1)
