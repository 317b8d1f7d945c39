"""NCCL: the communicators of TCP links, the order of their transfers, fanout (src/link/nccl/)."""
