// Public surface of the tensor layer: named tensors over links (tensor sets), in-place updates,
// safetensors. Importing it registers the 'tensor-set' and 'nccl-tensor-set' transfer handlers (the receiving process
// needs it too; the package index imports it).
export { TensorMap, type TensorArray, type TensorMemory } from './tensor-map.js';
export { HostArray } from '../arrays/host-array.js';
export { updateInPlace, type UpdateOptions, type UpdateResult, type NamedTensors } from './update.js';
export { loadSafetensors, type LoadSafetensorsOptions } from './load.js';
export {
  readSafetensorsHeader, parseSafetensorsHeader, writeSafetensors, SAFETENSORS_DTYPES,
  type SafetensorsHeader, type SafetensorsEntry, type SafetensorsInput,
} from './safetensors.js';
import './tensor-set-transfer.js';
import './nccl-transfer.js';
export {
  LayoutBuilder, LayoutError, tensorParallelParameter, placementBox, placementPieces, shardRange, validateLayout, encodeLayout, decodeLayout,
  layoutFingerprint, planSharded, planBytes, runsOf, RUN_FIELDS,
  type RankLayout, type GlobalTensor, type LocalTensor, type Piece, type Box, type Placement, type PlacementSpec, type PlacedPieces,
  type BoxSpec, type PlacedSpec, type ArrayLikeTensor, type ParameterSpec, type TensorParallelSpec,
  type ShardPlan, type PlanPair, type PlanPath, type PlanOptions, type PlanRun, type LayoutErrorCode, type LayoutErrorDetail,
  ShardGroup, hostRunCopier, DEFAULT_SHARD_CHUNK_BYTES,
  type ShardGroupOptions, type ShardHostOptions, type ShardJoinOptions, type ShardSyncResult, type ShardFailureDetail, type ShardGroupState,
  type RunMemory, type CopyBatch, type RunCopier, type NcclPairs, type NcclRunMover, type ChunkSize, type ExecutorFactory,
} from './sharded/index.js';
