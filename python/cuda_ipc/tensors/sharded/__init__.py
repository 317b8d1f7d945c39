"""Sharded weights (issue 37; src/tensors/sharded in Node): layouts of what each rank holds or needs
(boxes, DTensor placements, fused and padded parameters), the plan of byte runs between ranks, the
layouts' wire format ('CISL', docs/PROTOCOL.md section 9), and the sync group that moves the runs
(ShardGroup: docs/PROTOCOL.md section 9.3)."""
from .errors import Box, LayoutError, LAYOUT_ERROR_CODES, format_range
from .placements import dtensor_box, dtensor_pieces, placement_box, placement_pieces, shard_range
from .layout import GlobalTensor, LocalTensor, Piece, RankLayout, contiguous_strides, validate_layout
from .builder import LayoutBuilder, tensor_parallel_parameter
from .layout_wire import LAYOUT_VERSION, MAX_LAYOUT_BYTES, decode_layout, encode_layout, layout_fingerprint
from .plan import SPLIT_MIN_BYTES, PlanPair, ShardPlan, plan_bytes, plan_sharded
from .runs import RUN_FIELDS, PlanRun
# The execution half: the sync group (group.py, hub.py) and its wire (group_wire.py).
from .group_wire import DEFAULT_SHARD_CHUNK_BYTES, ShardError
from .group import ShardGroup, SyncResult

__all__ = [
    "Box", "LayoutError", "LAYOUT_ERROR_CODES", "format_range", "dtensor_box", "dtensor_pieces", "placement_box", "placement_pieces", "shard_range",
    "GlobalTensor", "LocalTensor", "Piece", "RankLayout", "contiguous_strides", "validate_layout", "LayoutBuilder",
    "tensor_parallel_parameter", "LAYOUT_VERSION", "MAX_LAYOUT_BYTES", "decode_layout", "encode_layout",
    "layout_fingerprint", "SPLIT_MIN_BYTES", "PlanPair", "ShardPlan", "plan_bytes", "plan_sharded", "RUN_FIELDS", "PlanRun",
    "ShardGroup", "SyncResult", "ShardError", "DEFAULT_SHARD_CHUNK_BYTES",
]
