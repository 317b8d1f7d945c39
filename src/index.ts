// cuda-ipc: share CUDA GPU memory and events between Node.js processes with zero copies.
export { CudaError, IpcError, type IpcErrorCode } from './errors.js';
export {
  Device, driverVersion, peerAccessMatrix, peerLinks, workingDevice, setWorkingDevice,
  type DeviceCapabilities, type ComputeCapability, type MemoryInfo, type PeerAttributes, type PeerLink,
} from './cuda/device.js';
export { DeviceBuffer, type MemoryKind, type HostView, type AsyncCopyOptions } from './cuda/buffer.js';
export { Stream, type WaitCondition, type MemoryTarget } from './cuda/stream.js';
export { Event, type EventOptions } from './cuda/event.js';
export { Module, Kernel, compileCuda, type LaunchConfig, type Dim3, type CompileOptions } from './cuda/module.js';
export { arg, packKernelArgs, type KernelArg, type KernelArgType } from './cuda/kernel-args.js';
export { BuiltinKernels, type PatternCheck, type PatternElementType } from './cuda/builtins.js';
export {
  openIpcHandle, exportPointer, legacyCacheStats, configureImportCache, type IpcHandleOptions, type OpenIpcHandleOptions, type ImportCacheStats,
} from './ipc/legacy.js';
export { DeviceArray, openIpcArray } from './ipc/array.js';
export { IpcPool, type IpcPoolOptions } from './ipc/pool.js';
export { poolBufferExport, importIpcPool, type PoolBufferExport, type ImportIpcPoolOptions } from './ipc/pool-interop.js';
export {
  legacyHandleFromTorch, torchHandleOf, cudaHandleFromTorch, type TorchCudaHandle, type FromTorchOptions,
} from './ipc/torch-handle.js';
export {
  descriptorToJson, parseDescriptorJson, encodeDescriptor, decodeDescriptor, validateDescriptor,
  type Descriptor, type LegacyHandleDescriptor, type IpcEventDescriptor, type DescriptorJson,
} from './ipc/descriptor.js';
export { dtypeInfo, type DType } from './ipc/dtype.js';
export { arrayMeta, type ArrayMeta, type ArrayMetaInit } from './ipc/array-meta.js';
export {
  float16BitsFromNumber, numberFromFloat16Bits, bfloat16BitsFromNumber, numberFromBfloat16Bits,
} from './half-float.js';
export { openIpcEvent } from './ipc/event.js';
export { HostBuffer } from './host/index.js';
export {
  Link, spawn, parentLink, listen, connect, Listener, registerTransferHandler, unregisterTransferHandler, setLinkWorkingDevice, linkWorkingDevice,
  spawnPython, pythonPackageDirectory, type SpawnPythonOptions,
  type LinkState, type PeerCredentials, type SpawnOptions, type SpawnedChild, type ListenOptions, type ConnectOptions,
  type TransferHandler, type TransferEncoding,
} from './link/index.js';
export { type LinkOptions } from './link/index.js';
export { stats, type Stats } from './stats.js';
export { collectStatus, type StatusSnapshot, type ProcessStatus, type PeerShare, type CollectOptions } from './observe/reader.js';
export { traceLeaks } from './leak.js';
export { leaseStats, type LeaseStats, type LeaseCounts, type LinkLeaseStats } from './link/index.js';
export { deviceMemoryStats, type DeviceMemoryStats } from './cuda/buffer.js';
export {
  ChannelHub, ChannelProducer, ChannelConsumer, ChannelSlot, ChannelMessage, createChannel, acceptChannel, pipeline, pipelineStage,
  type ChannelRole, type ChannelTopology, type ChannelMemory, type ChannelWaitOptions, type ChannelOptions, type WaitMode,
  type CreateChannelOptions, type AcceptOptions, type AttachOptions, type SlotBuffer, type SlotBufferFor, type ChannelShape,
  type AcquireOptions, type PublishOptions, type ReleaseOptions, type ReceiveOptions, type ChannelStats,
  type Pipeline, type PipelineOptions, type PipelineStage,
} from './channel/index.js';
