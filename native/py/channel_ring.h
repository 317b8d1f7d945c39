// The C ring's interface (channel_ring.c): its result codes, the state of one end (struct
// cip_ring) and what a take fills (struct cip_message), and its functions. Included by
// channel_ring.c and by the Node addon (native/c_ring.cc), which compiles channel_ring.c in too:
// one implementation of the ring's hot path for both languages.
#ifndef CUDA_IPC_CHANNEL_RING_H
#define CUDA_IPC_CHANNEL_RING_H
#include <stdint.h>

#ifdef __cplusplus
#define CIP_STATIC_ASSERT static_assert
#else
#define CIP_STATIC_ASSERT _Static_assert
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Results (negative) shared with Python (channel/native_slot_ring.py names them).
enum {
  CIP_NONE = -1,            // nothing to take / no free slot
  CIP_NOT_ALIVE = -2,       // this participant's entry is no longer alive (detached)
  CIP_CONSUMERS_GONE = -3,  // every consumer the channel expects attached, and all left
  CIP_CORRUPT = -4,         // the control block is inconsistent: r->error says what
  CIP_SKIP = -5,            // broadcast: the message at the cursor is not held for us
  CIP_INVALID = -6,         // a bad argument (a slot index, a length): a bug of the caller
  CIP_CLOSED = -100,        // detached (the end was closed)
};
// publish: 0 ok, 1 busy (the lock stayed taken: nothing changed), 2 dropped, 3 detached.
enum { PUB_OK = 0, PUB_BUSY = 1, PUB_DROPPED = 2, PUB_DETACHED = 3 };
// take_message / take_messages: set on a result when this participant is no longer alive after taking.
#define CIP_TAKEN_DETACHED (1 << 24)
// take_message / take_messages: set on a result when the (last) message's record does not fit the
// layout (a length over the slot, meta over meta_bytes, an unknown meta kind): the slot stays taken.
#define CIP_TAKEN_BAD (1 << 25)
// What r->error says about CIP_CORRUPT (Python formats the message from it and error_a/error_b).
enum { ERR_TAIL = 1, ERR_HEAD = 2, ERR_SPAN = 3, ERR_RING_SLOT = 4, ERR_AHEAD = 5 };

struct cip_ring {
  uint64_t base;         // the control block's address here; 0 once detached
  uint64_t length;       // bytes mapped
  uint64_t taken;        // address of slot_count uint32 words: work sharing, the word each taken slot was set to
  uint64_t tail_seen;    // consumers: the tail read last (tail only grows)
  uint64_t error_a;      // CIP_CORRUPT: values for the message
  uint64_t error_b;
  uint32_t slot_count;
  uint32_t me;
  uint32_t max_participants;
  uint32_t broadcast;
  uint32_t participants_offset;
  uint32_t ring_offset;
  uint32_t slot_records_offset;
  uint32_t slot_record_bytes;
  uint32_t meta_bytes;
  uint32_t slot_bytes_lo;  // the data slots' size (a message's length is at most this)
  uint32_t slot_bytes_hi;
  uint32_t expect_consumers;
  uint32_t hint;         // producers: where the next claim starts
  uint32_t rotor;        // which sleeping consumer a wake-one starts at
  uint32_t error;        // CIP_CORRUPT: ERR_*
  uint32_t nbells;       // doorbells in bells[] (0 once detached)
  int32_t bells[32];     // participant k's eventfd
};

// What a consumer takes: the slot and its message's record (slot_ring.py read_message), filled by
// cip_take_message / cip_take_messages, in the order of the record a ChannelMessage keeps (consumer.py).
// position: -1 when at or above 2^53 (as read_message).
struct cip_message {
  uint32_t slot;         // take_message: with the result's CIP_TAKEN_* flags
  uint32_t pad0;
  int64_t position;
  uint64_t length;
  uint32_t publisher;
  uint8_t redelivered;   // 0 or 1
  uint8_t pad1[3];
  uint32_t ticket;
  uint32_t meta_kind;
  uint32_t meta_length;
  uint32_t pad2;
};
CIP_STATIC_ASSERT(sizeof(struct cip_message) == 48, "struct cip_message is 48 bytes (native_slot_ring.py _MESSAGE)");


int cip_abi_version(void);
int cip_ring_size(void);
int cip_message_size(void);
int cip_ring_init(struct cip_ring* r);
void cip_ring_detach(struct cip_ring* r);
int cip_signal_data(struct cip_ring* r, int all);
int cip_signal_space(struct cip_ring* r);
int cip_acquire(struct cip_ring* r);
int cip_claim_slots(struct cip_ring* r, uint32_t* out, uint32_t max);
int cip_has_free(struct cip_ring* r);
int cip_publish(struct cip_ring* r, uint32_t s, uint32_t length_lo, uint32_t length_hi, uint32_t meta_kind, const uint8_t* meta, uint32_t meta_len);
int cip_publish_bare(struct cip_ring* r, uint32_t s, int32_t length);
int cip_publish_written(struct cip_ring* r, uint32_t s);
int cip_publish_many(struct cip_ring* r, const uint32_t* slots, uint32_t count, int32_t length, int32_t* stopped);
int cip_discard(struct cip_ring* r, uint32_t s);
int cip_take_message(struct cip_ring* r, struct cip_message* m);
int cip_take_messages(struct cip_ring* r, struct cip_message* out, uint32_t max);
int cip_release(struct cip_ring* r, uint32_t s);
int cip_peek(struct cip_ring* r, uint32_t cursor_lo, uint32_t cursor_hi);
int cip_release_held(struct cip_ring* r, uint32_t s, uint32_t k);
int cip_spin_while_equal(struct cip_ring* r, uint32_t off, uint32_t expected, uint32_t ns);

#ifdef __cplusplus
}
#endif
#endif
