"""Cross-language descriptor check: for each JSON line on stdin,
  {"binary": hex}                        -> {"binary": re-encoded hex, "json": descriptor_to_json}
  {"torch": [handle hex, size, offset], "uuid", "pid", "byteOffset"} -> {"binary": hex of descriptor_from_torch}
  {"json": descriptor JSON}              -> {"binary": hex}
one JSON line out, {"error": code} on failure."""
import json
import sys

from cuda_ipc import IpcError, decode_descriptor, parse_descriptor_json, descriptor_from_torch, descriptor_to_json, encode_descriptor

for line in sys.stdin:
    req = json.loads(line)
    try:
        if "binary" in req:
            d = decode_descriptor(bytes.fromhex(req["binary"]))
            out = {"binary": encode_descriptor(d).hex(), "json": descriptor_to_json(d)}
        elif "torch" in req:
            h, size, offset = req["torch"]
            d = descriptor_from_torch((bytes.fromhex(h), size, offset), req["uuid"], pid=req["pid"], byte_offset=req.get("byteOffset", 0))
            out = {"binary": encode_descriptor(d).hex()}
        else:
            out = {"binary": encode_descriptor(parse_descriptor_json(req["json"])).hex()}
    except IpcError as e:
        out = {"error": e.code, "message": str(e)}
    print(json.dumps(out), flush=True)
