// Devices: enumeration, identity (UUID, not ordinal: CUDA_VISIBLE_DEVICES renumbers), capabilities,
// peer links between devices, the primary context that every allocation of this project lives in,
// and the working device: the GPU this thread maps memory for when it imports another process's.
import { driver, Attr, HandleType, P2PAttr } from './driver.js';
import { IpcError } from '../errors.js';
import { invalidArgType } from '../arg-errors.js';

/** A device's compute capability, e.g. `{ major: 9, minor: 0 }` for an H100. */
export interface ComputeCapability { major: number; minor: number }

/** What a device supports for sharing (`device.capabilities`, `cuda-ipc info`). */
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

/** Free and total device memory in bytes (`device.memoryInfo()`). */
export interface MemoryInfo { free: number; total: number }

/** What cuDeviceGetP2PAttribute says about the link from one device to another. */
export interface PeerAttributes {
  /** Kernels on the first device can read and write the second's memory (ACCESS_SUPPORTED). */
  accessSupported: boolean;
  /** Atomic operations over the link are native (NATIVE_ATOMIC_SUPPORTED). */
  nativeAtomics: boolean;
  /** The driver's relative performance rank of the link (PERFORMANCE_RANK); compare ranks of one machine only. */
  performanceRank: number;
}

/** One directed pair of distinct devices and its attributes. */
export interface PeerLink extends PeerAttributes {
  from: Device;
  to: Device;
}

/** Formats 16 UUID bytes as nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
export function formatUuid(bytes: Uint8Array): string {
  const h = Buffer.from(bytes).toString('hex');
  return `GPU-${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

/** Per-thread current context: set only when it changes (each worker thread has its own copy). */
let currentContext = 0n;

/**
 * A CUDA device: `Device.get(i)`, `Device.all()`, `Device.byUuid(uuid)`. The same object every
 * time for one device; it travels between processes as its UUID.
 */
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
    const all = Device.all();
    // Received UUIDs are already in nvidia-smi's form: try that before normalising.
    for (const d of all) if (d.uuid === uuid) return d;
    const found = all.find((d) => d.uuid === uuid.toLowerCase().replace(/^gpu-/, 'GPU-'));
    if (!found) {
      throw new IpcError('ERR_UNKNOWN_DEVICE',
        `no visible CUDA device has UUID ${uuid}: the memory lives on a GPU this process cannot see. ` +
        `Visible: ${Device.all().map((d) => d.uuid).join(', ') || 'none'}; check CUDA_VISIBLE_DEVICES in both processes`);
    }
    return found;
  }

  /** @internal The device's primary context (retained once, on first use; not made current). */
  get primaryContext(): bigint {
    if (this.#context === 0n) this.#context = driver.devicePrimaryCtxRetain(this.ordinal);
    return this.#context;
  }

  /** Makes this device's primary context current on the calling thread (retained once). */
  activate(): void {
    const ctx = this.primaryContext;
    if (currentContext !== ctx) {
      driver.ctxSetCurrent(ctx);
      currentContext = ctx;
    }
  }

  /** Free and total device memory, as the driver reports them now. */
  memoryInfo(): MemoryInfo {
    this.activate();
    const [free, total] = driver.memGetInfo();
    return { free, total };
  }

  /** True when this device can access `peer`'s memory (cuDeviceCanAccessPeer). */
  canAccessPeer(peer: Device): boolean {
    return peer.ordinal !== this.ordinal && driver.deviceCanAccessPeer(this.ordinal, peer.ordinal);
  }

  /**
   * What the driver says about this device using `peer`'s memory (cuDeviceGetP2PAttribute, this
   * device as the source of the link). For the device itself, which the driver refuses to ask
   * about, its own memory: accessible, native atomics, rank 0.
   */
  peerAttributes(peer: Device): PeerAttributes {
    if (peer === this) return { accessSupported: true, nativeAtomics: true, performanceRank: 0 };
    const get = (attribute: number) => driver.deviceGetP2PAttribute(attribute, this.ordinal, peer.ordinal);
    return {
      accessSupported: get(P2PAttr.ACCESS_SUPPORTED) === 1,
      nativeAtomics: get(P2PAttr.NATIVE_ATOMIC_SUPPORTED) === 1,
      performanceRank: get(P2PAttr.PERFORMANCE_RANK),
    };
  }

  /**
   * Lets kernels and copies in this device's context use memory that `peer`'s context allocated
   * (cuCtxEnablePeerAccess). Imports do this by themselves where needed; idempotent. Throws
   * ERR_PEER_UNREACHABLE where the two devices cannot reach each other.
   */
  enablePeerAccess(peer: Device): void {
    if (peer === this) return;
    assertPeerReachable(this, peer);
    const peerContext = peer.primaryContext;
    this.activate();
    driver.ctxEnablePeerAccess(peerContext);
  }

  /** Waits (blocking this thread) for all work on this device's context: for tests and the CLI. */
  synchronize(): void {
    this.activate();
    driver.ctxSynchronize();
  }

  /** The device's description as plain data (what `cuda-ipc info --json` prints). */
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

/** Every directed pair of distinct devices with its peer attributes (none on a one-GPU machine). */
export function peerLinks(devices: readonly Device[] = Device.all()): PeerLink[] {
  return devices.flatMap((from) => devices.filter((to) => to !== from).map((to) => ({ from, to, ...from.peerAttributes(to) })));
}

/** The identity a peer-access refusal names (a Device, or a stand-in in tests). */
export interface DeviceIdentity { readonly ordinal: number; readonly name: string; readonly uuid: string }

const describeDevice = (d: DeviceIdentity) => `device ${d.ordinal} (${d.name}, ${d.uuid})`;

/**
 * Throws ERR_PEER_UNREACHABLE, naming both devices, unless kernels on `user` can use memory that
 * lives on `resident`. `canAccess` is the driver's answer (cuDeviceCanAccessPeer) unless given.
 */
export function assertPeerReachable<D extends DeviceIdentity>(user: D, resident: D,
  canAccess: (user: D, resident: D) => boolean = (u, r) => (u as unknown as Device).canAccessPeer(r as unknown as Device)): void {
  if (user === resident || user.uuid === resident.uuid) return;
  if (canAccess(user, resident)) return;
  throw new IpcError('ERR_PEER_UNREACHABLE',
    `${describeDevice(user)} cannot use memory that lives on ${describeDevice(resident)}: the driver reports no peer access ` +
    'between them (cuDeviceCanAccessPeer; see `cuda-ipc info`). Work on the device the memory lives on for it ' +
    '(spawn({ device }), setWorkingDevice(), setLinkWorkingDevice()), or copy it through host memory');
}

// ---------------------------------------------------------------------------------------------
// The working device: which GPU this thread maps imported memory for. Unset, an import maps the
// memory for the device it lives on; set, every import (through links, channels or descriptors)
// maps it for the working device, with peer access where the memory lives elsewhere.

/** The environment variable spawn({ device }) sets in the child: the UUID of its working device. */
export const WORKING_DEVICE_ENV = 'CUDA_IPC_DEVICE';

let working: Device | undefined;
let workingFromEnv = true;  // until setWorkingDevice() is called, the environment decides
// CUDA_IPC_DEVICE as first read: spawn() sets it when it starts the process, and every import
// asks for the working device (a process.env read is a call into C++ each time).
let envUuid: string | undefined | null = null;

/**
 * The device this thread works on, if one was chosen: with setWorkingDevice(), or by the parent
 * (spawn's `device` option, which sets CUDA_IPC_DEVICE to the device's UUID). undefined when none
 * was: imports then use the device the memory lives on. Throws ERR_UNKNOWN_DEVICE when the parent
 * named a GPU this process cannot see. (CUDA_IPC_DEVICE is read once, at the first call.)
 */
export function workingDevice(): Device | undefined {
  if (!workingFromEnv) return working;
  if (envUuid === null) envUuid = process.env[WORKING_DEVICE_ENV];
  const uuid = envUuid;
  if (uuid === undefined || uuid === '') return undefined;
  if (working === undefined) {  // resolved once: the variable no longer changes
    try {
      working = Device.byUuid(uuid);
    } catch (e) {
      if (!(e instanceof IpcError)) throw e;
      throw new IpcError('ERR_UNKNOWN_DEVICE',
        `this process was told to work on GPU ${uuid} (${WORKING_DEVICE_ENV}, set by its parent's spawn({ device })), but ${e.message}`, { cause: e });
    }
  }
  return working;
}

/**
 * Chooses the device this thread works on (a Device or its UUID): memory imported from now on is
 * mapped for it, wherever it lives. undefined goes back to mapping imports for the device the
 * memory lives on (the environment is no longer consulted either way).
 */
export function setWorkingDevice(device: Device | string | undefined): void {
  const d = typeof device === 'string' ? Device.byUuid(device) : device;
  if (d !== undefined && !(d instanceof Device)) {
    throw invalidArgType('setWorkingDevice expects a Device, a device UUID (\'GPU-…\') or undefined');
  }
  working = d;
  workingFromEnv = false;
}

/** The device used where none is given (streams, events, modules, allocations): the working device, else device 0. */
export function defaultDevice(): Device {
  return workingDevice() ?? Device.get(0);
}

/**
 * @internal The device an import maps memory living on `resident` for: `override` (e.g. a link's
 * working device), else the working device, else `resident`; checked for peer access.
 */
export function importingDevice(resident: Device, override?: Device): Device {
  const user = override ?? workingDevice() ?? resident;
  assertPeerReachable(user, resident);
  return user;
}
