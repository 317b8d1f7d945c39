// Public surface of host memory. Importing it registers the HostBuffer transfer handler.
export { HostBuffer } from './host-buffer.js';
import './host-transfer.js';
