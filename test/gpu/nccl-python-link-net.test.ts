// The tests of nccl-python-link.test.ts on NCCL's network path: P2P and shared memory off, the socket
// transport over loopback, as between two machines without InfiniBand. Set before NCCL reads its
// environment (this process's and the children's).
process.env.CUDA_IPC_TEST_NCCL_NET = '1';
await import('./nccl-python-link.test.js');
