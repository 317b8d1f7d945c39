// A channel end as `cuda-ipc status` lists it: slot states and members read from the control
// block when the status publisher samples it (a few times a second at most), never per message.
import { registerChannel, type ChannelPeerStatus, type ChannelRegistration } from '../observe/hooks.js';
import { P, PState, PRole } from './layout.js';
import type { Ring } from './slot-ring.js';
import type { Block } from './block.js';
import type { ChannelRole } from './options.js';

/** What a snapshot reads of a channel end (endpoint.ts's Endpoint, which registers itself). */
export interface ObservedEnd {
  readonly ring: Ring;
  readonly block: Block;
  readonly role: ChannelRole;
  /** The memory was released: nothing may touch it any more. */
  readonly released: boolean;
}

const STATE_NAMES: Record<number, string> = {
  [PState.Alive]: 'live', [PState.Ended]: 'ended', [PState.Dead]: 'died', [PState.Recovering]: 'recovering',
};

/** Lists `end` in this process's status record until the returned registration is unregistered. */
export function observeChannelEnd(end: ObservedEnd): ChannelRegistration {
  return registerChannel({
    snapshot() {
      const ring = end.ring;
      const block = end.block;
      const peers: ChannelPeerStatus[] = [];
      let hubPid = 0;
      if (!end.released) {
        for (let k = 0; k < block.layout.maxParticipants; k++) {
          const st = ring.participantState(k);
          if (st === PState.Empty) continue;
          const po = ring.partOff(k);
          const pid = ring.w.load32(po + P.pid);
          const role = ring.w.load32(po + P.role);
          if (role === PRole.Hub) { hubPid = pid; continue; }
          peers.push({ pid, role: role === PRole.Producer ? 'producer' : role === PRole.Consumer ? 'consumer' : 'none', state: STATE_NAMES[st] ?? `state ${st}` });
        }
      }
      const slots = end.released ? { free: 0, writing: 0, published: 0, taken: 0 } : ring.slotCounts();
      return {
        id: `hub pid ${hubPid || '?'}`,
        role: end.role, topology: block.topology, memory: block.memory, slotBytes: block.slotBytes, slots, peers,
      };
    },
  });
}
