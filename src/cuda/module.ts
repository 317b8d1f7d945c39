// Modules and kernels: load PTX or cubin, look up functions, launch them with typed arguments.
// CUDA C can be compiled at run time through NVRTC where the library is installed.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readRegularFile } from '../safe-files.js';
import { driver } from './driver.js';
import { Device, defaultDevice } from './device.js';
import { Stream, streamHandle } from './stream.js';
import { IpcError } from '../errors.js';
import { DriverObject } from './driver-object.js';
import { packKernelArgs, kernelArgLayout, checkKernelArgs, type KernelArg, type KernelParam } from './kernel-args.js';
import { invalidArgValue, outOfRange, badNumber } from '../arg-errors.js';

/** Grid or block dimensions: x, or [x, y, z] (missing ones are 1). */
export type Dim3 = number | readonly [number, number?, number?];

/** How a kernel is launched: grid and block dimensions, dynamic shared memory, stream. */
export interface LaunchConfig {
  grid: Dim3;
  block: Dim3;
  sharedMemBytes?: number;
  /** The legacy default stream when omitted. */
  stream?: Stream;
}

function dims(d: Dim3, what: string): [number, number, number] {
  const [x, y = 1, z = 1] = typeof d === 'number' ? [d] : d;
  for (const v of [x, y, z]) {
    if (!Number.isInteger(v) || v < 1 || v > 0x7fffffff) {
      throw outOfRange(`${what} dimensions must be positive integers, got [${typeof d === 'number' ? d : d.join(', ')}]`);
    }
  }
  return [x, y ?? 1, z ?? 1];
}

/** A kernel of a loaded Module (`module.getFunction(name)`); `launch(config, args)` queues it. */
export class Kernel {
  /** Declared parameter types, when known (built-in kernels); launches are checked against them. */
  readonly params: readonly KernelParam[] | undefined;

  /** @internal */
  constructor(readonly module: Module, readonly name: string, readonly handle: bigint, params?: readonly KernelParam[]) {
    this.params = params;
  }

  /** Queues the kernel; returns at once (await the stream or an event to know it finished). */
  launch(config: LaunchConfig, args: readonly KernelArg[]): void {
    if (this.params) checkKernelArgs({ name: this.name, params: this.params }, args);
    const [gx, gy, gz] = dims(config.grid, 'grid');
    const [bx, by, bz] = dims(config.block, 'block');
    const shared = config.sharedMemBytes ?? 0;
    if (!Number.isInteger(shared) || shared < 0) throw badNumber(shared, `sharedMemBytes must be a non-negative integer, got ${shared}`);
    const packed = packKernelArgs(args);
    const offsets = Uint32Array.from(kernelArgLayout(args.map((a) => a.type)).offsets);
    this.module.device.activate();
    this.module.handle; // throws if the module was unloaded
    driver.launchKernel(this.handle, gx, gy, gz, bx, by, bz, shared, streamHandle(config.stream), packed, offsets);
  }
}

/**
 * Loaded GPU code (PTX or a cubin) on one device: `Module.load(image)`, `Module.loadFile(path)`,
 * `compileCuda(source)`.
 */
export class Module extends DriverObject {
  readonly #kernels = new Map<string, Kernel>();

  private constructor(device: Device, handle: bigint) {
    super(device, handle, 'Module', (h) => driver.moduleUnload(h));
  }

  /** Loads PTX (text) or a cubin/fatbin image; the driver JIT-compiles PTX for this GPU. */
  static load(image: string | Uint8Array, device: Device = defaultDevice()): Module {
    const bytes = typeof image === 'string' ? new TextEncoder().encode(image) : image;
    if (bytes.byteLength === 0) throw invalidArgValue('the module image is empty');
    device.activate();
    return new Module(device, driver.moduleLoadData(bytes));
  }

  /**
   * Loads a PTX or cubin file on `device` (default: the working device, else device 0). The file
   * must be a regular file of at most 1 GiB (ERR_FILE_UNSAFE otherwise: a FIFO or a device is not read).
   */
  static loadFile(path: string | URL, device: Device = defaultDevice()): Module {
    const file = path instanceof URL ? fileURLToPath(path) : path;
    return Module.load(readRegularFile(file, { maxBytes: MAX_MODULE_FILE_BYTES, followSymlinks: true, what: 'the module file' }).bytes, device);
  }

  /** The kernel with this (unmangled, extern "C") name. */
  getFunction(name: string, params?: readonly KernelParam[]): Kernel {
    let k = this.#kernels.get(name);
    if (!k) {
      this.device.activate();
      k = new Kernel(this, name, driver.moduleGetFunction(this.handle, name), params);
      this.#kernels.set(name, k);
    }
    return k;
  }
}

/** The largest module file loadFile() reads. */
const MAX_MODULE_FILE_BYTES = 2 ** 30;

// Where NVRTC may live: an explicit override, the toolkit, then the loader's search path.
function nvrtcCandidates(): string[] {
  const out: string[] = [];
  if (process.env.CUDA_IPC_NVRTC) out.push(process.env.CUDA_IPC_NVRTC);
  for (const root of [process.env.CUDA_HOME, process.env.CUDA_PATH, '/usr/local/cuda'].filter((r): r is string => !!r)) {
    for (const name of ['libnvrtc.so', 'libnvrtc.so.13', 'libnvrtc.so.12']) {
      const p = join(root, 'lib64', name);
      if (existsSync(p)) out.push(p);
    }
  }
  out.push('libnvrtc.so', 'libnvrtc.so.13', 'libnvrtc.so.12');
  return out;
}

/** Options of compileCuda() (NVRTC). */
export interface CompileOptions {
  /** Program name shown in diagnostics. */
  name?: string;
  /** Extra NVRTC options, e.g. ['-DN=4']. A virtual architecture of the device is added. */
  options?: string[];
  /** Device whose compute capability to target (default: the working device, else device 0). */
  device?: Device;
}

/** Compiles CUDA C to PTX with NVRTC. Throws ERR_UNSUPPORTED where NVRTC is not installed. */
export function compileCuda(source: string, options: CompileOptions = {}): string {
  try {
    driver.nvrtcLoad(nvrtcCandidates());
  } catch (e) {
    throw new IpcError('ERR_UNSUPPORTED',
      `${(e as Error).message}\nInstall the CUDA toolkit's NVRTC, or set CUDA_IPC_NVRTC to the path of libnvrtc.so; ` +
      'alternatively load precompiled PTX with Module.load', { cause: e });
  }
  const device = options.device ?? defaultDevice();
  const { major, minor } = device.computeCapability;
  const opts = [`--gpu-architecture=compute_${major}${minor}`, '-default-device', ...(options.options ?? [])];
  const r = driver.nvrtcCompile(source, options.name ?? 'program.cu', opts);
  if (!r.ok) throw new IpcError('ERR_COMPILE', `NVRTC could not compile ${options.name ?? 'the program'}: ${r.error}\n${r.log}`);
  return r.ptx!;
}
