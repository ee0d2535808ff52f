"""A GGUF file read in one pass over its header: the metadata as Python values and every
tensor as a numpy view of the memory-mapped file (no copy, no per-element loop).

gguf-py's `GGUFReader` builds a numpy object for each element of each metadata array, so
the 49k-token vocabulary and 48k merges of the default model alone cost it seconds; here
a numeric array is one `np.frombuffer` and a string array one short loop over byte
offsets. Only what the converter and the packer read is supported: GGUF versions 2 and 3,
little-endian.

    magic "GGUF", u32 version, u64 tensor count, u64 metadata count
    metadata:  string key, u32 value type, value         (strings: u64 length + UTF-8)
    tensors:   string name, u32 dims, u64 dims[] (fastest first), u32 ggml type, u64 offset
    padding to `general.alignment` (32), then the tensor data at those offsets
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
            10: "<u8", 11: "<i8", 12: "<f8"}  # GGUF value type -> numpy dtype
_STRING, _ARRAY, _BOOL = 8, 9, 7


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str  # gguf-py's GGMLQuantizationType name: "Q4_1", "Q8_0", "F32", ...
    shape: tuple[int, ...]  # torch order: [rows, columns]
    data: np.ndarray  # the file's bytes (uint8, [rows, row bytes]) or values (F32/F16)


class _Cursor:
    def __init__(self, buf: np.ndarray) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        value = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.take("<IQ")
            return self.array(item, n)
        dtype = np.dtype(_SCALARS[kind])
        v = np.frombuffer(self.buf, dtype, 1, self.pos)[0].item()
        self.pos += dtype.itemsize
        return bool(v) if kind == _BOOL else v

    def array(self, item: int, n: int) -> list[Any]:
        if item in _SCALARS:
            dtype = np.dtype(_SCALARS[item])
            values = np.frombuffer(self.buf, dtype, n, self.pos)
            self.pos += dtype.itemsize * n
            return [bool(v) for v in values] if item == _BOOL else values.tolist()
        if item == _STRING:
            out, buf, pos = [], self.buf, self.pos
            raw = memoryview(buf)
            for _ in range(n):
                length = int.from_bytes(raw[pos:pos + 8], "little")
                out.append(bytes(raw[pos + 8:pos + 8 + length]).decode("utf-8",
                                                                       errors="replace"))
                pos += 8 + length
            self.pos = pos
            return out
        return [self.value(item) for _ in range(n)]  # arrays of arrays: rare, small


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]  # in file order

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    def arch(self, key: str, default: Any = None) -> Any:
        """`<architecture>.<key>` from the metadata (e.g. arch("block_count"))."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def read_gguf(path: Path | str) -> GGUFFile:
    """`path`'s metadata and tensors; the tensors stay memory-mapped."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    cur.pos = 4
    version, n_tensors, n_kv = cur.take("<IQQ")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} (2 and 3 are supported)")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = cur.take("<" + "Q" * cur.take("<I"))
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        infos.append((name, dims, GGMLQuantizationType(cur.take("<I")), cur.take("<Q")))
    align = int(metadata.get("general.alignment", 32))
    start = (cur.pos + align - 1) // align * align
    tensors = {}
    for name, dims, qtype, offset in infos:
        shape = tuple(int(d) for d in reversed(dims))
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        row_bytes = dims[0] // block * block_bytes
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        raw = buf[start + offset:start + offset + rows * row_bytes]
        if qtype.name in ("F32", "F16"):
            data = raw.view(np.float32 if qtype.name == "F32" else np.float16).reshape(shape)
        else:
            data = raw.reshape(rows, row_bytes)
        tensors[name] = TensorInfo(name, qtype.name, shape, data)
    return GGUFFile(path, metadata, tensors)
