"""Named tensors: tensor sets, in-place updates, sharded weights (cuda_ipc.tensors.sharded)."""
