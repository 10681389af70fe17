#!/usr/bin/python3
"""An independent safetensors reader and writer, written from the format's specification with only
json and numpy, for safetensors_test's interoperability check.

    safetensors_interop.py MODEL_DIR OUT_FILE

Reads the model Accelerant saved in MODEL_DIR (model.safetensors, or the index and its shards),
checks the layout rules, and writes OUT_FILE holding every tensor transformed (numbers doubled,
booleans negated), in reverse name order and with an unpadded header, so that Accelerant's
reader meets a file laid out differently from the ones it writes. Prints a JSON summary.
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32,
          "I64": np.int64, "F16": np.float16, "BF16": np.uint16, "F32": np.float32, "F64": np.float64}


def read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    assert (8 + n) % 8 == 0, f"{path}: the data does not start 8-byte aligned"
    body = data[8 + n:]
    tensors, covered = {}, 0
    entries = sorted((k, v) for k, v in header.items() if k != "__metadata__")
    for name, info in sorted(entries, key=lambda e: e[1]["data_offsets"][0]):
        begin, end = info["data_offsets"]
        assert begin == covered, f"{path}: {name} does not follow the tensor before it"
        covered = end
        array = np.frombuffer(body[begin:end], dtype=np.dtype(DTYPES[info["dtype"]]).newbyteorder("<"))
        tensors[name] = (info["dtype"], array.reshape(info["shape"]))
    assert covered == len(body), f"{path}: {len(body) - covered} bytes after the last tensor"
    return tensors, header.get("__metadata__", {})


def read_model(model_dir):
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        tensors, metadata = read_file(os.path.join(model_dir, "model.safetensors"))
        return tensors, 1, metadata
    with open(index_path) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    tensors, total = {}, 0
    for file in files:
        part, metadata = read_file(os.path.join(model_dir, file))
        for name, (dtype, array) in part.items():
            assert index["weight_map"][name] == file, f"{name} is in {file}, the index says otherwise"
            tensors[name] = (dtype, array)
            total += array.nbytes
    assert set(tensors) == set(index["weight_map"]), "the index and the shards list different tensors"
    assert index["metadata"]["total_size"] == total, "total_size is not the tensors' bytes"
    return tensors, len(files), metadata


def transform(dtype, array):
    if dtype == "BOOL":
        return np.logical_not(array)
    if dtype == "BF16":  # numpy has no bfloat16: widen to float32 (exact), double, narrow (exact)
        wide = (array.astype(np.uint32) << 16).view(np.float32) * np.float32(2)
        return (wide.view(np.uint32) >> 16).astype(np.uint16)
    return (array * 2).astype(array.dtype)


def write_file(path, tensors):
    header, chunks, offset = {"__metadata__": {"written_by": "safetensors_interop.py"}}, [], 0
    for name in sorted(tensors, reverse=True):
        dtype, array = tensors[name]
        raw = np.ascontiguousarray(array).astype(np.dtype(array.dtype).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def main():
    model_dir, out_file = sys.argv[1], sys.argv[2]
    tensors, files, metadata = read_model(model_dir)
    write_file(out_file, {name: (dtype, transform(dtype, a)) for name, (dtype, a) in tensors.items()})
    print(json.dumps({"files": files, "tensors": len(tensors), "format": metadata.get("format", "")}))


if __name__ == "__main__":
    main()
