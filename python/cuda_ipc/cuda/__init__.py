"""CUDA objects: the driver through ctypes, devices, streams and events (src/cuda/)."""
