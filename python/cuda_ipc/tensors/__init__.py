"""Named tensors over links (src/tensors/): tensor sets, in-place updates, sharded weights (cuda_ipc.tensors.sharded)."""
