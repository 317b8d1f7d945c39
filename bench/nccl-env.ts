// NCCL's forced network path, for the benches and the GPU tests alike.

/** NCCL's network path, as between two machines without InfiniBand: P2P and shared memory off, sockets over loopback. */
export const NET_ENV = { NCCL_P2P_DISABLE: '1', NCCL_SHM_DISABLE: '1', NCCL_NET: 'Socket', NCCL_SOCKET_IFNAME: 'lo' } as const;

/**
 * The environment of an NCCL rank on the network path that NCCL takes for a machine of its own:
 * NET_ENV and an NCCL_HOSTID of its own (NCCL's host hash). NCCL refuses two ranks on one GPU only
 * when they share host hash and bus id, so with this, network-path ranks may all sit on one GPU
 * where there is one: each is a "node", and their bytes cross the socket transport as they would
 * between machines. `name` tells the ranks of one run apart.
 */
export function asOwnHost(name: string | number): Record<string, string> {
  return { ...NET_ENV, NCCL_HOSTID: `cuda-ipc-${process.pid}-${name}` };
}
