// Sharded weights (issue 37): layouts of what each rank holds or needs, the plan of byte runs
// between ranks, the layouts' wire format, and the sync group that moves the bytes (ShardGroup:
// the device copier, the NCCL mover and the host copier under it).
export { LayoutError, formatRange, type LayoutErrorCode, type LayoutErrorDetail, type Box } from './errors.js';
export { shardRange, placementBox, placementPieces, type Placement, type PlacementSpec, type PlacedPieces } from './placements.js';
export {
  validateLayout, contiguousStrides, type RankLayout, type GlobalTensor, type LocalTensor, type Piece,
} from './layout.js';
export {
  LayoutBuilder, tensorParallelParameter, type BoxSpec, type PlacedSpec, type ArrayLikeTensor, type ParameterSpec, type TensorParallelSpec,
} from './builder.js';
export { encodeLayout, decodeLayout, layoutFingerprint, LAYOUT_VERSION, MAX_LAYOUT_BYTES } from './layout-wire.js';
export { planSharded, planBytes, SPLIT_MIN_BYTES, type ShardPlan, type PlanPair, type PlanPath, type PlanOptions } from './plan.js';
export { RUN_FIELDS, runsOf, type PlanRun } from './runs.js';
export {
  ShardGroup, type ShardGroupOptions, type ShardHostOptions, type ShardJoinOptions, type ShardSyncResult, type ShardFailureDetail, type ShardGroupState,
} from './group.js';
export { hostRunCopier } from './host-copy.js';
export {
  DEFAULT_SHARD_CHUNK_BYTES, type RunMemory, type CopyBatch, type RunCopier, type NcclPairs, type NcclRunMover, type ChunkSize, type ExecutorFactory,
} from './execute-types.js';
