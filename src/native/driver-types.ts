// Types of the addon's CUDA driver functions (native/driver.cc and the files beside it, one per
// concept: device.cc, memory.cc, stream.cc, ...): near 1:1 with the driver API.
// Pointers and handles are bigint; every function throws CudaError on a failed driver call.

export type Bytes = ArrayBufferView | ArrayBuffer;

export interface CudaAddon {
  setErrorClass(ctor: new (status: number, code: string, description: string, call: string) => Error): void;
  setCompletionHandler(handler: (id: number) => void): void;

  driverGetVersion(): number;
  deviceGetCount(): number;
  deviceGet(ordinal: number): number;
  deviceGetName(device: number): string;
  deviceGetUuid(device: number): Uint8Array;
  deviceGetAttribute(attribute: number, device: number): number;
  deviceTotalMem(device: number): number;
  deviceGetPCIBusId(device: number): string;
  deviceCanAccessPeer(device: number, peer: number): boolean;
  /** cuDeviceGetP2PAttribute for the link from srcDevice to dstDevice (which must differ). */
  deviceGetP2PAttribute(attribute: number, srcDevice: number, dstDevice: number): number;
  devicePrimaryCtxRetain(device: number): bigint;
  devicePrimaryCtxRelease(device: number): void;
  ctxSetCurrent(context: bigint): void;
  ctxGetCurrent(): bigint;
  ctxSynchronize(): void;
  /** Lets the current context use peerContext's memory; false when it already could. */
  ctxEnablePeerAccess(peerContext: bigint): boolean;
  memGetInfo(): [free: number, total: number];

  memAlloc(bytes: number): bigint;
  memFree(pointer: bigint): void;
  memAllocManaged(bytes: number): bigint;
  memAllocHost(bytes: number): bigint;
  memFreeHost(pointer: bigint): void;
  /** cuMemHostRegister: page-locks [address, address + bytes) and maps it for the device. */
  memHostRegister(address: bigint, bytes: number, flags: number): void;
  memHostUnregister(address: bigint): void;
  /** The device address of registered host memory. */
  memHostGetDevicePointer(address: bigint): bigint;
  memGetAddressRange(pointer: bigint): [base: bigint, size: number];
  pointerGetAttributeInt(attribute: number, pointer: bigint): number;
  pointerGetAttributeU64(attribute: number, pointer: bigint): bigint;
  memcpyHtoD(destination: bigint, source: Bytes): void;
  memcpyDtoH(destination: Bytes, source: bigint): void;
  memcpyDtoD(destination: bigint, source: bigint, bytes: number): void;
  memcpyHtoDAsync(destination: bigint, source: Bytes, stream: bigint): void;
  memcpyDtoHAsync(destination: Bytes, source: bigint, stream: bigint): void;
  memcpyDtoDAsync(destination: bigint, source: bigint, bytes: number, stream: bigint): void;
  memsetD8(pointer: bigint, value: number, count: number): void;
  memsetD32(pointer: bigint, value: number, count: number): void;
  memsetD8Async(pointer: bigint, value: number, count: number, stream: bigint): void;
  memsetD32Async(pointer: bigint, value: number, count: number, stream: bigint): void;

  /** The 64-byte handle, written into `out` (and returned) when given. */
  ipcGetMemHandle(pointer: bigint, out?: Uint8Array): Uint8Array;
  ipcOpenMemHandle(handle: Uint8Array): bigint;
  ipcCloseMemHandle(pointer: bigint): void;
  legacyExportRegister(handle: Uint8Array, base: bigint): void;
  legacyExportUnregister(handle: Uint8Array): void;
  /** Maps the handle's allocation in `context` (which must be current), once per process and context. */
  legacyImportAcquire(handle: Uint8Array, context: bigint): [base: bigint, local: boolean, size: number];
  legacyImportRelease(handle: Uint8Array, context: bigint): boolean;
  /** Closes the mapping of `handle` in `context` now if nothing uses it; true when one was closed. */
  legacyImportDrop(handle: Uint8Array, context: bigint): boolean;
  /** The exporter freed the allocation: closes idle mappings of it now, busy ones at their last release. Returns how many it closed. */
  legacyImportForget(handle: Uint8Array): number;
  /** Forgets local exports whose allocation was freed; returns how many. */
  legacyExportSweep(): number;
  legacyCacheStats(): ImportCacheStats;
  legacyCacheConfigure(idleLimit: number): void;
  ipcGetEventHandle(event: bigint): Uint8Array;
  ipcOpenEventHandle(handle: Uint8Array): bigint;

  streamCreate(flags: number): bigint;
  streamDestroy(stream: bigint): void;
  streamQuery(stream: bigint): boolean;
  streamSynchronize(stream: bigint): void;
  streamWaitEvent(stream: bigint, event: bigint): void;
  streamOnComplete(stream: bigint, id: number): void;
  streamWaitValue32(stream: bigint, address: bigint, value: number, flags: number): void;
  streamWaitValue64(stream: bigint, address: bigint, value: bigint, flags: number): void;
  streamWriteValue32(stream: bigint, address: bigint, value: number, flags: number): void;
  streamWriteValue64(stream: bigint, address: bigint, value: bigint, flags: number): void;
  eventCreate(flags: number): bigint;
  eventDestroy(event: bigint): void;
  eventRecord(event: bigint, stream: bigint): void;
  eventQuery(event: bigint): boolean;

  memPoolCreate(device: number, handleTypes: number, maxSize: number): bigint;
  memPoolDestroy(pool: bigint): void;
  memPoolSetReleaseThreshold(pool: bigint, bytes: bigint): void;
  memPoolSetAccess(pool: bigint, device: number, flags: number): void;
  memPoolTrimTo(pool: bigint, bytes: number): void;
  memPoolExportToFd(pool: bigint): number;
  memPoolImportFromFd(fd: number): bigint;
  /** The 64 bytes of export data, written into `out` (and returned) when given. */
  memPoolExportPointer(pointer: bigint, out?: Uint8Array): Uint8Array;
  memPoolImportPointer(pool: bigint, exportData: Uint8Array): bigint;
  memAllocFromPoolAsync(bytes: number, pool: bigint, stream: bigint): bigint;
  memFreeAsync(pointer: bigint, stream: bigint): void;
  /**
   * Starts this thread's export worker over `table` (slots of 128 bytes, src/ipc/prepared-exports.ts),
   * which it keeps alive; once per thread.
   */
  exportWorkerStart(table: ArrayBuffer): void;
  /** The worker exports the pointer in slot `slot` (queued, its pointer and context written). */
  exportWorkerPost(slot: number): void;

  moduleLoadData(image: Bytes): bigint;
  moduleUnload(module: bigint): void;
  moduleGetFunction(module: bigint, name: string): bigint;
  nvrtcLoad(paths: string[]): string;
  nvrtcVersion(): [major: number, minor: number];
  nvrtcCompile(source: string, name: string, options: string[]): { ok: boolean; ptx?: string; log: string; error?: string };

  launchKernel(fn: bigint, gx: number, gy: number, gz: number, bx: number, by: number, bz: number,
    sharedMemBytes: number, stream: bigint, packedArgs: Bytes, offsets: Uint32Array): void;
}

/** The process's legacy import cache (native/legacy_ipc.cc), shared by all its threads. */
export interface ImportCacheStats {
  /** Allocations mapped from other processes through legacy handles. */
  mappings: number;
  /** Of those, mappings no buffer uses, kept so that reopening costs nothing. */
  idle: number;
  idleLimit: number;
  /** Open buffers over the mappings. */
  references: number;
  /** Allocations this process exported. */
  exports: number;
  /** Handles opened so far (cuIpcOpenMemHandle calls; a mapping found in the cache opens none). */
  opened: number;
}
