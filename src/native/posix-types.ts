// Types of the addon's POSIX functions (native/fd.cc, socket.cc, shared_memory.cc). Every function
// throws a Node-style system error (`code` such as 'EAGAIN', `errno`, `syscall`) when its system
// call fails.

/** An mmap(MAP_SHARED) of an fd it owns (only once the constructor returned). */
export interface NativeSharedMemory {
  /** An external ArrayBuffer over [offset, offset + length) of the mapping; detached by close(). */
  arrayBuffer(offset: number, length: number): ArrayBuffer;
  /** Copies destination.byteLength bytes at `offset` of the mapping into `destination`. */
  copyOut(offset: number, destination: ArrayBufferView | ArrayBuffer): void;
  /** Copies `source` into the mapping at `offset`. */
  copyIn(offset: number, source: ArrayBufferView | ArrayBuffer): void;
  /** Detaches every ArrayBuffer made by arrayBuffer(), unmaps, closes the fd. Idempotent. */
  close(): void;
  /** Closes the fd now (fd reads -1 after); the mapping stays until close(). Idempotent. */
  closeFd(): void;
  readonly address: bigint;
  /** -1 once closed. */
  readonly fd: number;
  readonly byteLength: number;
}

/**
 * A connected SOCK_SEQPACKET socket that owns its fd and is watched by uv_poll.
 * onMessage(status, length, fds, cred): one call per record; the bytes are recvBuffer[0, length)
 * and are valid only during the call. status bit 1: truncated record; bit 2: fds dropped by the
 * kernel; when status != 0 the fds that did arrive were already closed. cred is [pid, uid, gid]
 * when the kernel attached SCM_CREDENTIALS. From the call on, the fds belong to JS.
 * onState('writable') after setInterest(_, true) once there is room; 'eof' when the peer closed;
 * 'error' with an errno. Polling stops after 'eof' and 'error'.
 */
export interface NativeSocket {
  /** Sends head[0, headLength) followed by body as one record with fds attached (SCM_RIGHTS).
   * Returns false, having sent nothing, when the socket is full (EAGAIN). */
  send(head: ArrayBufferView, headLength: number, body: ArrayBufferView | null, fds: readonly number[] | null): boolean;
  /** send()'s record and then `second` (a record of its own, no fds) in one call (sendmmsg). Returns the
   * records sent: 2; 1 (the first only: send `second` yourself); 0 (the socket is full: nothing). */
  sendPair(head: ArrayBufferView, headLength: number, body: ArrayBufferView | null, fds: readonly number[] | null, second: Uint8Array): number;
  setInterest(readable: boolean, writable: boolean): void;
  ref(): void;
  unref(): void;
  /** Stops polling and closes the fd. Idempotent. */
  close(): void;
  readonly fd: number;
  readonly recvBuffer: ArrayBuffer;
}
export interface NativeSocketConstructor {
  new (
    fd: number,
    bufferSize: number,
    onMessage: (status: number, length: number, fds: number[] | undefined, cred: [number, number, number] | undefined) => void,
    onState: (what: 'writable' | 'eof' | 'error', errno: number | undefined) => void,
  ): NativeSocket;
}

/** A listening socket that owns its fd: onAccept(fd) per connection, onAccept(-errno) on error
 * (polling pauses until setInterest(true)). */
export interface NativeAcceptor {
  setInterest(readable: boolean): void;
  ref(): void;
  unref(): void;
  close(): void;
  readonly fd: number;
}
export interface NativeAcceptorConstructor {
  new (fd: number, onAccept: (fdOrError: number) => void): NativeAcceptor;
}

/** An fd owned by a native object: closed by close(), by the finalizer, or at environment teardown. */
export interface NativeOwnedFd {
  /** Closes the fd; idempotent. */
  close(): void;
  /** -1 once closed. */
  readonly fd: number;
}

export interface PosixConstants {
  readonly F_SEAL_SEAL: number;
  readonly F_SEAL_SHRINK: number;
  readonly F_SEAL_GROW: number;
  readonly F_SEAL_WRITE: number;
  readonly SOCK_SEQPACKET: number;
  /** Most fds one record may carry. */
  readonly MAX_FDS: number;
  readonly PAGE_SIZE: number;
}

export interface PosixAddon {
  /** memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING), then ftruncate(size) and F_ADD_SEALS(seals) when given (the fd is closed if they fail). */
  memfdCreate(name: string, size?: number, seals?: number): number;
  ftruncate(fd: number, size: number): void;
  /** fstat(fd).st_size */
  fstatSize(fd: number): number;
  getSeals(fd: number): number;
  /** pread(2) into `target` at file `offset`; the bytes read (0 at the end of the file). */
  pread(fd: number, target: ArrayBufferView, offset: number): number;
  /** pwrite(2) of `source` at file `offset`; the bytes written. */
  pwrite(fd: number, source: ArrayBufferView, offset: number): number;
  /** What fstat(2) says the fd is. */
  fileKind(fd: number): 'file' | 'directory' | 'fifo' | 'socket' | 'character' | 'block' | 'link' | 'unknown';
  addSeals(fd: number, seals: number): void;
  /** fcntl(F_DUPFD_CLOEXEC) */
  dup(fd: number): number;
  close(fd: number): void;
  setCloexec(fd: number, on: boolean): void;
  setNonblocking(fd: number, on: boolean): void;
  /** socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK) */
  socketpair(): [number, number];
  /** socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK) */
  socket(): number;
  bind(fd: number, path: string): void;
  listen(fd: number, backlog: number): void;
  /** Non-blocking connect: succeeds or throws at once (EAGAIN when the backlog is full). */
  connect(fd: number, path: string): void;
  /** getsockopt(SO_PEERCRED) */
  peerCred(fd: number): { pid: number; uid: number; gid: number };
  /** setsockopt(SO_PASSCRED): the kernel then attaches the sender's credentials to records. */
  setPassCred(fd: number, on: boolean): void;
  /** getsockopt(SO_TYPE) */
  socketType(fd: number): number;
  detachArrayBuffer(buffer: ArrayBuffer): void;
  SharedMemory: new (fd: number, length: number) => NativeSharedMemory;
  /** Takes ownership of fd once constructed. */
  OwnedFd: new (fd: number) => NativeOwnedFd;
  Socket: NativeSocketConstructor;
  Acceptor: NativeAcceptorConstructor;
  posixConstants: PosixConstants;
}
