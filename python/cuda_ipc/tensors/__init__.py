"""Tensors: named tensors over links, in-place updates (src/tensors/)."""
