// A link frame and the RELEASE frame that follows it, in one system call (sendmmsg: two records, so
// each stays one frame of docs/PROTOCOL.md section 1). Python's outbox
// (python/cuda_ipc/link/connection/outbox.py) calls it for a reply whose thread ended leases just
// before: the peer gets both records from one wake-up, the sender saves a sendmsg. Never blocks: a
// full socket says 0 and the caller sends its own way.
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#define CIP_EXPORT __attribute__((visibility("default")))

enum { MAX_FDS = 64 };  // PROTOCOL.md section 1: fds per record

// Records sent: 2, 1 (the frame went, the RELEASE did not: the caller sends it), 0 (the socket is
// full: nothing went), or -errno (nothing went). `fds`: `nfds` native ints for the frame.
CIP_EXPORT int cip_send_pair(int fd, const uint8_t* frame, uint32_t frame_len, const int* fds, uint32_t nfds,
                             const uint8_t* release, uint32_t release_len) {
  if (nfds > MAX_FDS || (nfds > 0 && fds == NULL) || frame == NULL || release == NULL) return -EINVAL;
  struct iovec iov[2] = {{(void*)frame, frame_len}, {(void*)release, release_len}};
  union {
    struct cmsghdr align;
    char bytes[CMSG_SPACE(sizeof(int) * MAX_FDS)];
  } control;
  struct mmsghdr msgs[2];
  memset(msgs, 0, sizeof msgs);
  msgs[0].msg_hdr.msg_iov = &iov[0];
  msgs[0].msg_hdr.msg_iovlen = 1;
  msgs[1].msg_hdr.msg_iov = &iov[1];
  msgs[1].msg_hdr.msg_iovlen = 1;
  if (nfds > 0) {
    memset(&control, 0, sizeof control);
    msgs[0].msg_hdr.msg_control = control.bytes;
    msgs[0].msg_hdr.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msgs[0].msg_hdr);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  int r;
  do r = sendmmsg(fd, msgs, 2, MSG_DONTWAIT | MSG_NOSIGNAL); while (r < 0 && errno == EINTR);
  if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
  return r;
}
