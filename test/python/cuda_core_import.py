"""Opens a Node pool buffer with cuda.core's own IPC API, from the public Node export (argv[1], JSON
of poolBufferExport with exportData in hex) and the pool's fd (3): checks the float32 values
i * 0.5 + 1 and writes 5 everywhere. Prints {"ok": ...} or {"skipped": why}."""
import ctypes
import json
import os
import struct
import sys

spec = json.loads(sys.argv[1])
try:
    import cuda.core as cc
except ImportError as e:
    print(json.dumps({"skipped": f"cuda.core is not installed: {e}"}))
    sys.exit(0)
from cuda_ipc import Device
from cuda_ipc.cuda import driver as drv
from cuda_ipc.ipc.pool_interop import ipc_buffer_descriptor  # IPCBufferDescriptor._init(payload, size), wherever this cuda.core keeps it

dev = cc.Device(Device.by_uuid(spec["deviceUuid"]).ordinal)
dev.set_current()
mr = cc.DeviceMemoryResource.from_allocation_handle(dev, 3)  # duplicates the fd
os.close(3)
# Read-write access of this device to the imported pool, as the CUDA IPC sample sets it (the
# cuda.core source we read does not; setting it twice is harmless).
with Device.by_uuid(spec["deviceUuid"]).activate():
    drv.pool_set_access(int(mr.handle), Device.by_uuid(spec["deviceUuid"]).ordinal)
desc = ipc_buffer_descriptor(bytes.fromhex(spec["exportData"]), spec["allocationSize"])
stream = dev.create_stream()
try:
    buf = cc.Buffer.from_ipc_descriptor(mr, desc, stream=stream)
except TypeError:
    buf = cc.Buffer.from_ipc_descriptor(mr, desc, stream)
n = spec["length"] // 4
ptr = int(buf.handle) + spec["offset"]
host = bytearray(4 * n)
with Device.by_uuid(spec["deviceUuid"]).activate():
    drv.memcpy_dtoh(ctypes.addressof((ctypes.c_char * len(host)).from_buffer(host)), ptr, len(host))
    values = struct.unpack(f"<{n}f", host)
    ok = all(values[i] == i * 0.5 + 1 for i in range(n)) and buf.size == spec["allocationSize"]
    fives = struct.pack(f"<{n}f", *([5.0] * n))
    drv.memcpy_htod(ptr, ctypes.cast(ctypes.c_char_p(fives), ctypes.c_void_p).value, len(fives))
buf.close()
stream.sync()
print(json.dumps({"ok": ok, "first": list(values[:3])}))
