// cuda-ipc: share CUDA GPU memory and events between Node.js processes with zero copies.
// The emitted index.d.ts names what the declarations need (Node's types, Disposable), so they
// type-check in a project whose tsconfig lists no `types` (TypeScript 7's default) or an older lib.
/// <reference types="node" preserve="true" />
/// <reference lib="es2022" preserve="true" />
/// <reference lib="esnext.disposable" preserve="true" />
export { CudaError, IpcError, type IpcErrorCode } from './errors.js';
export {
  Device, driverVersion, peerAccessMatrix, peerLinks, workingDevice, setWorkingDevice,
  type DeviceCapabilities, type ComputeCapability, type MemoryInfo, type PeerAttributes, type PeerLink,
} from './cuda/device.js';
export { DeviceBuffer, type MemoryKind, type HostView, type AsyncCopyOptions } from './cuda/buffer.js';
export { Stream, type WaitCondition, type MemoryTarget } from './cuda/stream.js';
export { Event, type EventOptions } from './cuda/event.js';
export { Module, Kernel, compileCuda, type LaunchConfig, type Dim3, type CompileOptions } from './cuda/module.js';
export {
  arg, packKernelArgs, type KernelArg, type KernelArgType, type SmallIntegerArgType, type BigIntegerArgType, type FloatArgType, type KernelParam,
  type DevicePointerLike,
} from './cuda/kernel-args.js';
export { BuiltinKernels, type PatternCheck, type PatternElementType } from './cuda/builtins.js';
export type { BuiltinKernelName } from './cuda/builtin-kernels.js';
export {
  openIpcHandle, exportPointer, legacyCacheStats, configureImportCache, type IpcHandleOptions, type OpenIpcHandleOptions, type ImportCacheStats,
} from './ipc/legacy.js';
export { DeviceArray, openIpcArray } from './arrays/device-array.js';
export { BufferArray, type ArrayMemory } from './arrays/buffer-array.js';
export { IpcPool, type IpcPoolOptions } from './ipc/pool.js';
export { poolBufferExport, importIpcPool, type PoolBufferExport, type ImportIpcPoolOptions } from './ipc/pool-interop.js';
export {
  legacyHandleFromTorch, torchHandleOf, cudaHandleFromTorch, type TorchCudaHandle, type FromTorchOptions,
} from './ipc/torch-handle.js';
export {
  descriptorToJson, parseDescriptorJson, encodeDescriptor, decodeDescriptor, validateDescriptor,
  type Descriptor, type LegacyHandleDescriptor, type IpcEventDescriptor, type DescriptorJson,
  type DescriptorKind, type DescriptorOf, type ArrayMetaJson, type DescriptorJsonOf, type LegacyHandleDescriptorJson, type IpcEventDescriptorJson,
} from './ipc/descriptor.js';
export { dtypeInfo, type DType, type DTypeInfo, type HostArrayTypes, type HostArrayConstructor } from './ipc/dtype.js';
export { arrayMeta, type ArrayMeta, type ArrayMetaInit } from './ipc/array-meta.js';
export {
  float16BitsFromNumber, numberFromFloat16Bits, bfloat16BitsFromNumber, numberFromBfloat16Bits,
} from './half-float.js';
export { openIpcEvent } from './ipc/event.js';
export { HostBuffer } from './host/index.js';
export {
  Link, spawn, parentLink, listen, connect, Listener, registerTransferHandler, unregisterTransferHandler, setLinkWorkingDevice, linkWorkingDevice,
  spawnPython, pythonPackageDirectory, type SpawnPythonOptions,
  type LinkEvents, type ListenerEvents, type LinkState, type PeerCredentials, type SpawnOptions, type SpawnedChild, type ListenOptions, type ConnectOptions,
  type TransferHandler, type TransferEncoding,
  TcpListener, type TcpListenOptions, type TcpListenerEvents, type TcpConnectOptions, type TcpLinkOptions, type TlsLinkOptions, type LinkUrl, type RemoteEndpoint,
  type LinkTransportKind, Fanout, preloadNccl, type RefusedReport,
} from './link/index.js';
export { type LinkOptions, type LinkLimits, type InboxCounts, type SendQueueCounts, setMaxReceivedBytes, receivedMemory, type ReceivedMemoryCounts } from './link/index.js';
export { type WaitOptions } from './abort.js';
export { stats, type Stats, type TrafficStats, type LinkTraffic } from './stats.js';
export { collectStatus, type StatusSnapshot, type ProcessStatus, type PeerShare, type CollectOptions } from './observe/reader.js';
export type { ChannelStatus, ChannelPeerStatus, ChannelSlotCounts } from './observe/hooks.js';
export type { LinkRecord } from './observe/record.js';
export { traceLeaks } from './leak.js';
export {
  leaseStats, type LeaseStats, type LeaseCounts, type LinkLeaseStats, type LeaseHold, type ReceivedLease, type ReceiveOptions as LinkReceiveOptions,
} from './link/index.js';
export { deviceMemoryStats, type DeviceMemoryStats } from './cuda/buffer.js';
export {
  ChannelHub, ChannelProducer, ChannelConsumer, ChannelSlot, ChannelMessage, createChannel, acceptChannel, pipeline, pipelineStage,
  type ChannelRole, type ChannelTopology, type ChannelMemory, type ChannelWaitOptions, type ChannelOptions, type WaitMode, type WaitPolicy,
  type CreateChannelOptions, type AcceptOptions, type AttachOptions, type SlotBuffer, type SlotBufferFor, type ChannelShape,
  type AcquireOptions, type PublishOptions, type PublishArgs, type ReleaseOptions, type ReceiveOptions, type ChannelStats,
  type Pipeline, type PipelineOptions, type PipelineStage,
} from './channel/index.js';
export {
  loadNccl, ncclUniqueId, asNcclUniqueId, formatNcclVersion, NcclLibrary, NcclCommunicator, NcclError, NcclUnavailableError, NcclResult, ncclResultName,
  NCCL_UNIQUE_ID_BYTES, NCCL_LIBRARY_ENV,
  type LoadNcclOptions, type NcclInitOptions, type NcclCallOptions, type NcclOperation, type NcclBuffer, type NcclResultName, type NcclAttempt,
  type NcclUniqueId, type NcclSource,
} from './nccl/index.js';
// [tensors] named tensors over links, in-place updates, safetensors (issue 21).
export * from './tensors/index.js';
