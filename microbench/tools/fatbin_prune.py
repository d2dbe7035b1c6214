#!/usr/bin/env python3
"""Shrink a CUDA shared library for one GPU major: zero the fatbin payloads of cubins built
for other SM versions (the driver never loads those; PTX entries are kept for JIT), so the
file compresses to what that GPU needs. Used to carry vLLM's `_moe_C` library to the device
under the 64 MiB working-tree limit (`data/h200_sxm/vllm_marlin/README.md`):

    pip download --no-deps vllm==0.24.0 && unzip -j vllm-0.24.0-*.whl 'vllm/_moe_C_stable_libtorch.abi3.so'
    strip --strip-unneeded _moe_C_stable_libtorch.abi3.so -o moe_s.so
    python3 microbench/tools/fatbin_prune.py moe_s.so moe_h.so 90
    mkdir -p microbench/.vllm_blob && xz -T2 -9 -c moe_h.so > microbench/.vllm_blob/moe_h.so.xz

Standard library only; needs `readelf` for the section offset.
"""
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
CUBIN = 2


def fatbin_section(path):
    out = subprocess.check_output(["readelf", "-S", "-W", path], text=True)
    for line in out.splitlines():
        if ".nv_fatbin" in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    sys.exit(f"{path}: no .nv_fatbin section")


def main():
    src, dst, keep_sm = sys.argv[1], sys.argv[2], int(sys.argv[3])
    off, size = fatbin_section(src)
    buf = bytearray(open(src, "rb").read())
    data = memoryview(buf)[off:off + size]
    pos, zeroed, kept = 0, 0, 0
    while pos + 16 <= len(data):
        magic, _ver, header, body = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        entry, end = pos + header, pos + header + body
        while entry < end:
            kind, _unk, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            sm = struct.unpack_from("<I", data, entry + 28)[0]
            start = entry + entry_header
            if kind == CUBIN and sm != keep_sm:
                data[start:start + payload] = bytes(payload)
                zeroed += payload
            else:
                kept += payload
            entry = start + payload
        pos = end
    open(dst, "wb").write(buf)
    print(f"kept {kept} bytes of sm_{keep_sm} cubins and PTX, zeroed {zeroed}")


if __name__ == "__main__":
    main()
