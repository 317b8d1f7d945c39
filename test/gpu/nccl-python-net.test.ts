// The tests of nccl-python.test.ts on NCCL's network path: P2P and shared memory off, the socket
// transport over loopback, each process an NCCL host of its own (as between two machines; one GPU
// serves both). Set before NCCL reads its environment (this process's and the child's).
process.env.CUDA_IPC_TEST_NCCL_NET = '1';
await import('./nccl-python.test.js');
