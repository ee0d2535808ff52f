"""A GGUF file read in one pass over its header: the metadata as Python values and every
tensor as a numpy view of the memory-mapped file (no copy, no per-element loop), which
gives its values dequantised or, in a type our kernels run, its groups.

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
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch and the kernels only when a tensor's values are asked for
    import torch

    from stepserve.model.ggml_kernels import GGMLKernels
    from stepserve.model.quant import GGUFMatrix

_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
            10: "<u8", 11: "<i8", 12: "<f8"}  # GGUF value type -> numpy dtype
_STRING, _ARRAY, _BOOL = 8, 9, 7


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type_name: str  # gguf-py's GGMLQuantizationType name: "Q4_1", "Q8_0", "F32", ...
    shape: tuple[int, ...]  # torch order: [rows, columns]
    data: np.ndarray  # the file's bytes (uint8, [rows, row bytes]) or values (F32/F16)

    @property
    def runs_quantised(self) -> bool:
        """Whether our kernels run this tensor's type as it is (quant.py)."""
        from stepserve.model.quant import KERNEL_FORMAT

        return self.type_name in KERNEL_FORMAT

    def matrix(self) -> GGUFMatrix:
        """The tensor's groups, copied out of the mapped file (a type that runs quantised)."""
        import torch

        from stepserve.model.quant import GGUFMatrix

        return GGUFMatrix.from_blocks(self.type_name, torch.from_numpy(np.array(self.data)))

    def dequantized(self, kernels: GGMLKernels | None = None) -> torch.Tensor:
        """float32 [rows, columns], the values gguf-py dequantises to (the float reference's
        bits); with `kernels`, a type they run is dequantised by them in one threaded pass
        (the same arithmetic)."""
        import torch

        if self.runs_quantised:
            m = self.matrix()
            if kernels is None:
                return m.dequantize()
            from stepserve.model.quant import KERNEL_FORMAT

            return kernels.dequantize(KERNEL_FORMAT[m.fmt], m.qs, m.scales, self.shape[1],
                                      torch.empty(self.shape))
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        values = dequantize(self.data, GGMLQuantizationType[self.type_name])
        return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(self.shape)


def unpermute_rows(num_rows: int, num_heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's Q/K permutation (transformers'
    `_reverse_permute_weights`: rows (head, i, pair) become (head, pair, i)). llama.cpp's
    converter permutes the rows of Q and K so that rotary pairs are adjacent."""
    import torch

    dim = num_rows // num_heads // 2
    return torch.arange(num_rows).view(num_heads, dim, 2).transpose(1, 2).reshape(-1)


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
    tensors: dict[str, GGUFTensor]  # in file order

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
        tensors[name] = GGUFTensor(name, qtype.name, shape, data)
    return GGUFFile(path, metadata, tensors)
