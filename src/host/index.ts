// Public surface of host memory.
export { HostBuffer } from './host-buffer.js';
