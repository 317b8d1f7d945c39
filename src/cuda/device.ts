// Devices: enumeration, identity (UUID, not ordinal: CUDA_VISIBLE_DEVICES renumbers), capabilities,
// and the primary context that every allocation of this project lives in.
import { driver, Attr, HandleType } from './driver.js';
import { IpcError } from '../errors.js';

export interface ComputeCapability { major: number; minor: number }

export interface DeviceCapabilities {
  /** cuIpcGetMemHandle / cuIpcOpenMemHandle (Linux, unified addressing, not integrated). */
  legacyIpc: boolean;
  memoryPools: boolean;
  /** IPC memory pools shared through POSIX file descriptors. */
  posixFdPoolHandles: boolean;
  fabricPoolHandles: boolean;
  ipcEvents: boolean;
  streamMemOps: boolean;
  streamMemOps64: boolean;
  unifiedAddressing: boolean;
  managedMemory: boolean;
}

export interface MemoryInfo { free: number; total: number }

/** Formats 16 UUID bytes as nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
export function formatUuid(bytes: Uint8Array): string {
  const h = Buffer.from(bytes).toString('hex');
  return `GPU-${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

/** Per-thread current context: set only when it changes (each worker thread has its own copy). */
let currentContext = 0n;

export class Device {
  readonly ordinal: number;
  readonly name: string;
  readonly uuid: string;
  /** The UUID's 16 raw bytes (CUuuid), as wire formats carry it. */
  readonly uuidBytes: Uint8Array;
  readonly computeCapability: ComputeCapability;
  readonly totalMemory: number;
  readonly pciBusId: string;
  readonly multiprocessors: number;
  readonly capabilities: DeviceCapabilities;
  #context = 0n;

  private constructor(ordinal: number) {
    const d = driver.deviceGet(ordinal);
    const attr = (a: number) => driver.deviceGetAttribute(a, d);
    this.ordinal = ordinal;
    this.name = driver.deviceGetName(d);
    this.uuidBytes = driver.deviceGetUuid(d);
    this.uuid = formatUuid(this.uuidBytes);
    this.computeCapability = { major: attr(Attr.COMPUTE_CAPABILITY_MAJOR), minor: attr(Attr.COMPUTE_CAPABILITY_MINOR) };
    this.totalMemory = driver.deviceTotalMem(d);
    this.pciBusId = driver.deviceGetPCIBusId(d);
    this.multiprocessors = attr(Attr.MULTIPROCESSOR_COUNT);
    const unified = attr(Attr.UNIFIED_ADDRESSING) === 1;
    const pools = attr(Attr.MEMORY_POOLS_SUPPORTED) === 1;
    const poolHandles = pools ? attr(Attr.MEMPOOL_SUPPORTED_HANDLE_TYPES) : 0;
    this.capabilities = {
      legacyIpc: process.platform === 'linux' && unified && attr(Attr.INTEGRATED) === 0,
      memoryPools: pools,
      posixFdPoolHandles: (poolHandles & HandleType.POSIX_FD) !== 0,
      fabricPoolHandles: (poolHandles & HandleType.FABRIC) !== 0,
      ipcEvents: attr(Attr.IPC_EVENT_SUPPORTED) === 1,
      streamMemOps: attr(Attr.CAN_USE_STREAM_WAIT_VALUE_NOR) === 1 || attr(Attr.CAN_USE_64_BIT_STREAM_MEM_OPS) === 1,
      streamMemOps64: attr(Attr.CAN_USE_64_BIT_STREAM_MEM_OPS) === 1,
      unifiedAddressing: unified,
      managedMemory: attr(Attr.MANAGED_MEMORY) === 1,
    };
  }

  static #all: Device[] | undefined;

  /** Every visible device, in ordinal order. Throws CudaError when there is no usable driver. */
  static all(): readonly Device[] {
    if (!Device.#all) {
      const n = driver.deviceGetCount();
      Device.#all = Array.from({ length: n }, (_, i) => new Device(i));
    }
    return Device.#all;
  }

  /** The device with this ordinal (default 0). */
  static get(ordinal = 0): Device {
    const all = Device.all();
    if (!Number.isInteger(ordinal) || ordinal < 0 || ordinal >= all.length) {
      throw new IpcError('ERR_UNKNOWN_DEVICE',
        `there is no CUDA device ${ordinal}: ${all.length} device(s) are visible (ordinals 0..${all.length - 1}); check CUDA_VISIBLE_DEVICES`);
    }
    return all[ordinal]!;
  }

  /** The device with this UUID ('GPU-…'), as sent between processes. */
  static byUuid(uuid: string): Device {
    const found = Device.all().find((d) => d.uuid === uuid.toLowerCase().replace(/^gpu-/, 'GPU-'));
    if (!found) {
      throw new IpcError('ERR_UNKNOWN_DEVICE',
        `no visible CUDA device has UUID ${uuid}: the memory lives on a GPU this process cannot see. ` +
        `Visible: ${Device.all().map((d) => d.uuid).join(', ') || 'none'}; check CUDA_VISIBLE_DEVICES in both processes`);
    }
    return found;
  }

  /** Makes this device's primary context current on the calling thread (retained once). */
  activate(): void {
    if (this.#context === 0n) this.#context = driver.devicePrimaryCtxRetain(this.ordinal);
    if (currentContext !== this.#context) {
      driver.ctxSetCurrent(this.#context);
      currentContext = this.#context;
    }
  }

  /** Free and total device memory, as the driver reports them now. */
  memoryInfo(): MemoryInfo {
    this.activate();
    const [free, total] = driver.memGetInfo();
    return { free, total };
  }

  canAccessPeer(peer: Device): boolean {
    return peer.ordinal !== this.ordinal && driver.deviceCanAccessPeer(this.ordinal, peer.ordinal);
  }

  /** Waits (blocking this thread) for all work on this device's context: for tests and the CLI. */
  synchronize(): void {
    this.activate();
    driver.ctxSynchronize();
  }

  toJSON() {
    return {
      ordinal: this.ordinal, name: this.name, uuid: this.uuid, computeCapability: this.computeCapability,
      totalMemory: this.totalMemory, pciBusId: this.pciBusId, multiprocessors: this.multiprocessors,
      capabilities: this.capabilities,
    };
  }
}

/** The driver's CUDA version, e.g. 13000 for 13.0. */
export function driverVersion(): number {
  return driver.driverGetVersion();
}

/** Peer-access matrix: result[i][j] is whether device i can access memory of device j. */
export function peerAccessMatrix(devices: readonly Device[] = Device.all()): boolean[][] {
  return devices.map((a) => devices.map((b) => a === b || a.canAccessPeer(b)));
}
