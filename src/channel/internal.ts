// The machinery behind each public end and hub, for testing.ts: kept off the public classes.
import type { Endpoint } from './endpoint.js';
import type { Block } from './block.js';

export const endpointOf = new WeakMap<object, Endpoint>();
export const blockOf = new WeakMap<object, Block>();
