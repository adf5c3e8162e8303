"""Reading a GGUF file (llama.cpp's format) ourselves: its metadata fields and its tensors as views of
the memory-mapped file, the same fields and tensors as gguf.GGUFReader gives, in a fraction of the time.
hub.gguf turns them into a Hugging Face folder."""
from __future__ import annotations

import os
import struct

import numpy as np

class GGUFTensor:
    """One tensor of a GGUF file, as gguf.GGUFReader gives it: name, tensor_type, shape (GGUF's order,
    fastest dimension first) and data (a read-only view of the file: typed for F32/F16..., bytes per row
    for quantised types)."""

    def __init__(self, name: str, tensor_type, shape: list[int], data: np.ndarray):
        self.name, self.tensor_type, self.shape, self.data = name, tensor_type, shape, data


class GGUFFile:
    """A GGUF file's metadata and tensors, read without gguf.GGUFReader, whose per-item parsing of a
    262,144-token vocabulary takes tens of seconds on a small CPU (this takes well under one).
    fields: key -> Python value (arrays as lists); tensors: GGUFTensor, in the file's order."""

    _SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    _ARRAYS = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
               7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
    _TYPED = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
              "I32": np.int32, "I64": np.int64}

    def __init__(self, path: str | os.PathLike):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        self._mm = mm = np.memmap(path, dtype=np.uint8, mode="r")
        self._buf = buf = memoryview(mm)
        self._pos = 0
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("no GGUF magic number")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (only 2 and 3; a big-endian file?)")
        self._pos = 24
        self.fields: dict = {}
        for _ in range(n_kv):
            key = self._string()
            (kind,) = self._unpack("<I")
            self.fields[key] = self._value(kind)
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = list(self._unpack(f"<{n_dims}Q"))
            kind, offset = self._unpack("<IQ")
            infos.append((name, dims, GGMLQuantizationType(kind), offset))
        align = int(self.fields.get("general.alignment", 32))
        start = -(-self._pos // align) * align
        self.tensors = []
        for name, dims, qtype, offset in infos:
            n = int(np.prod(dims)) if dims else 1
            block, size = GGML_QUANT_SIZES[qtype]
            at, n_bytes = start + offset, n * size // block
            if at + n_bytes > len(mm):
                raise ValueError(f"tensor {name} runs past the end of the file")
            shape = tuple(reversed(dims))
            typed = self._TYPED.get(qtype.name)
            raw = mm[at:at + n_bytes]
            data = raw.view(typed).reshape(shape) if typed else raw.reshape(quant_shape_to_byte_shape(shape, qtype))
            self.tensors.append(GGUFTensor(name, qtype, dims, data))

    def _unpack(self, fmt: str):
        out = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return out

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        s = bytes(self._buf[self._pos:self._pos + n]).decode("utf-8")
        self._pos += n
        return s

    def _value(self, kind: int):
        if kind == 8:
            return self._string()
        if kind in self._SCALARS:
            return self._unpack(self._SCALARS[kind])[0]
        if kind != 9:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, count = self._unpack("<IQ")
        if item in self._ARRAYS:
            dt = np.dtype(self._ARRAYS[item])
            arr = np.frombuffer(self._buf, dtype=dt, count=count, offset=self._pos)
            self._pos += dt.itemsize * count
            return arr.tolist()
        if item == 8:  # strings: (u64 length, bytes) each
            buf, pos, out = self._buf, self._pos, []
            for _ in range(count):
                (n,) = struct.unpack_from("<Q", buf, pos)
                out.append(bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8"))
                pos += 8 + n
            self._pos = pos
            return out
        return [self._value(item) for _ in range(count)]


