#!/usr/bin/python3
"""Reference safetensors files for checkpoint_safetensors_test, written and read by PyTorch.

The safetensors package is not installed here, so this follows the format specification by hand:
an 8-byte little-endian header length, a JSON header padded with spaces to 8 bytes, then the
tensors' bytes back to back (the official writer's layout). Tensor bytes come from torch.

  checkpoint_reference.py write OUT.safetensors OUT.json
      writes tensors of several dtypes, and their values (as torch sees them) into OUT.json
  checkpoint_reference.py read IN.safetensors OUT.json
      checks IN against the specification as strictly as the official reader (no holes, no
      overlaps, exact sizes) and writes every tensor's dtype, shape and values into OUT.json

Exit code 77 means torch is missing (the test then skips).
"""
import json
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as error:
    print(f"torch/numpy unavailable: {error}", file=sys.stderr)
    sys.exit(77)

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: move the bits as int16
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def values(t):
    if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return t.double().flatten().tolist()
    return t.long().flatten().tolist()


def write(out_path, json_path):
    torch.manual_seed(0)
    tensors = {
        "f32": torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.25 - 1.0,
        "f32.random": torch.randn(5, 7),
        # 1e-6 is a half subnormal, 65504 the largest half.
        "f16": torch.tensor([1.0, -2.5, 65504.0, 1e-6, 0.1, -0.0], dtype=torch.float16),
        "bf16": torch.tensor([[1.0, 3.14159], [-1e30, 1e-3]], dtype=torch.bfloat16),
        "f64": torch.tensor([0.1, -1e300], dtype=torch.float64),
        "i64": torch.arange(-3, 3, dtype=torch.int64),
        "scalar": torch.tensor(7.5),
        "empty": torch.zeros(0, 3),
    }
    # The official writer orders by alignment (largest first) then name.
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header = {"__metadata__": {"format": "pt", "written_by": "torch " + torch.__version__}}
    offset = 0
    blobs = []
    for name in order:
        blob = tensor_bytes(tensors[name])
        header[name] = {"dtype": NAMES[tensors[name].dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(out_path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    expected = {name: {"dtype": NAMES[t.dtype], "shape": list(t.shape), "values": values(t)}
                for name, t in tensors.items()}
    with open(json_path, "w") as f:
        json.dump({"metadata": header["__metadata__"], "tensors": expected}, f)


def read(in_path, json_path):
    with open(in_path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header length past the end"
    assert (8 + n) % 8 == 0, f"data section starts at {8 + n}, not 8-byte aligned"
    header = json.loads(data[8:8 + n].decode())
    metadata = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in metadata.values()), "metadata values must be strings"
    buffer = data[8 + n:]
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    end = 0
    out = {}
    for name, entry in entries:
        begin, stop = entry["data_offsets"]
        assert begin == end, f"{name}: begins at {begin}, previous tensor ended at {end} (hole or overlap)"
        dtype = DTYPES[entry["dtype"]]
        size = torch.empty(0, dtype=dtype).element_size()
        count = int(np.prod(entry["shape"], dtype=np.int64))
        assert stop - begin == count * size, f"{name}: {stop - begin} bytes for {count} elements"
        assert begin % size == 0, f"{name}: offset {begin} not aligned to {size}"
        raw = bytearray(buffer[begin:stop])
        if dtype == torch.bfloat16:
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16) if raw else torch.zeros(0, dtype=dtype)
        else:
            t = torch.frombuffer(raw, dtype=dtype) if raw else torch.zeros(0, dtype=dtype)
        t = t.reshape(entry["shape"])
        out[name] = {"dtype": entry["dtype"], "shape": list(t.shape), "values": values(t)}
        end = stop
    assert end == len(buffer), f"data section has {len(buffer)} bytes, tensors cover {end}"
    with open(json_path, "w") as f:
        json.dump({"metadata": metadata, "tensors": out}, f)


if __name__ == "__main__":
    {"write": write, "read": read}[sys.argv[1]](sys.argv[2], sys.argv[3])
