// The hot path of a Python channel end, in C: one call per channel operation (acquire, publish,
// take, a batch of takes, release) instead of several ctypes calls to libatomic and tens of Python
// steps each; a take also reads the message's record, checked. Loaded by python/cuda_ipc/native.py
// with ctypes; the Python package keeps its own pure standard-library path
// (python/cuda_ipc/channel/slot_ring.py) for where this library is missing,
// and each function here is the same steps as the method of the same name there, with the same
// memory orders (docs/channel-protocol.md sections 4 and 5):
//  - every word another process may change concurrently: sequentially consistent atomics;
//  - where slot_ring.py uses a release store (x86-64 only: the publish's position, ring entry, tail and
//    lock, and the space sequence's bump after a freeing compare-and-swap), so does this file, on
//    x86-64 only; elsewhere those are sequentially consistent, as slot_ring.py's fallbacks are;
//  - plain fields (written only by the slot's owner before the state change that hands it on):
//    relaxed atomics, which compile to plain loads and stores.
//
// The state of one end lives in a struct cip_ring that Python allocates and fills (ctypes): the
// control block's address and layout, this participant's index, the doorbell fds, and the work
// sharing consumer's taken words (a Python-owned array, so that the pure Python code of the slow
// paths sees them too). Python checks the layout when it attaches; cip_ring_init checks again that
// every offset stays inside the mapping, and every function checks slot indices and positions read
// from the control block, which is never trusted: a bad value is an error code, never an access
// outside the mapping.
//
// Threads: Python calls these under the end's lock. cip_ring_detach (at close, also under the lock)
// zeroes the address and the doorbells; every call after it returns CIP_CLOSED and rings nothing.
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CIP_EXPORT __attribute__((visibility("default")))

// Bumped with every change of a signature or of struct cip_ring: Python refuses another version.
#define CIP_ABI_VERSION 3

// Layout version 4 (docs/channel-protocol.md section 3; python/cuda_ipc/channel/layout.py).
enum {
  H_TAIL = 64, H_LOCK = 72, H_DATA_SEQ = 76, H_DATA_SLEEPERS = 80, H_CONSUMER_MASK = 84, H_HEAD = 128,
  H_PRODUCERS_ATTACHED = 192, H_PRODUCERS_LIVE = 196, H_CONSUMERS_ATTACHED = 204, H_CONSUMERS_LIVE = 208,
  H_SPACE_SEQ = 256, H_SPACE_SLEEPERS = 260, HEADER_BYTES = 320,
  P_STATE = 0, ST_ALIVE = 1,
  S_STATE = 0, S_HOLDERS = 4, S_POSITION = 8, S_LENGTH = 16, S_META_LENGTH = 24, S_META_KIND = 28,
  S_PUBLISHER = 32, S_LAST_HOLDERS = 36, S_DELIVERIES = 40, S_TICKET = 44, S_META = 64,
  KIND_FREE = 0, KIND_WRITING = 1, KIND_PUBLISHED = 2, KIND_TAKEN = 3,
  GEN_SHIFT = 17, FLAG_REDELIVERED = 1 << 16, META_KIND_MAX = 2,
};
#define GEN_MASK (0x7FFFu << GEN_SHIFT)
#define MAX_U53 (UINT64_C(1) << 53)

// Result codes, struct cip_ring and struct cip_message: channel_ring.h (the Node addon includes it too).
#include "channel_ring.h"

CIP_EXPORT int cip_abi_version(void) { return CIP_ABI_VERSION; }
CIP_EXPORT int cip_ring_size(void) { return (int)sizeof(struct cip_ring); }
CIP_EXPORT int cip_message_size(void) { return (int)sizeof(struct cip_message); }

// ---- words ----------------------------------------------------------------------------------

static inline uint32_t* w32(const struct cip_ring* r, uint64_t off) { return (uint32_t*)(uintptr_t)(r->base + off); }
static inline uint64_t* w64(const struct cip_ring* r, uint64_t off) { return (uint64_t*)(uintptr_t)(r->base + off); }

static inline uint32_t load32(const struct cip_ring* r, uint64_t off) { return __atomic_load_n(w32(r, off), __ATOMIC_SEQ_CST); }
static inline void store32(const struct cip_ring* r, uint64_t off, uint32_t v) { __atomic_store_n(w32(r, off), v, __ATOMIC_SEQ_CST); }
// A 64-bit position or counter; -1 when it is at or above 2^53 (corrupt), as SharedWords.load64.
static inline int64_t load64(const struct cip_ring* r, uint64_t off) {
  uint64_t v = __atomic_load_n(w64(r, off), __ATOMIC_SEQ_CST);
  return v <= MAX_U53 ? (int64_t)v : -1;
}
static inline uint32_t cas32(const struct cip_ring* r, uint64_t off, uint32_t expected, uint32_t desired) {
  __atomic_compare_exchange_n(w32(r, off), &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;  // the value seen: == expected when it swapped
}
static inline void cas64(const struct cip_ring* r, uint64_t off, uint64_t expected, uint64_t desired) {
  __atomic_compare_exchange_n(w64(r, off), &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline uint32_t add32(const struct cip_ring* r, uint64_t off, uint32_t v) { return __atomic_fetch_add(w32(r, off), v, __ATOMIC_SEQ_CST); }
static inline uint32_t and32(const struct cip_ring* r, uint64_t off, uint32_t v) { return __atomic_fetch_and(w32(r, off), v, __ATOMIC_SEQ_CST); }
static inline uint32_t plain32(const struct cip_ring* r, uint64_t off) { return __atomic_load_n(w32(r, off), __ATOMIC_RELAXED); }
static inline void set_plain32(const struct cip_ring* r, uint64_t off, uint32_t v) { __atomic_store_n(w32(r, off), v, __ATOMIC_RELAXED); }

#if defined(__x86_64__)
// shared_words.py's release_store32/64 and bump32: a plain store on x86-64 (TSO), where a locked
// operation follows before any load that must not pass it (slot_ring.py says which).
static inline void release_store32(const struct cip_ring* r, uint64_t off, uint32_t v) { __atomic_store_n(w32(r, off), v, __ATOMIC_RELEASE); }
static inline void release_store64(const struct cip_ring* r, uint64_t off, uint64_t v) { __atomic_store_n(w64(r, off), v, __ATOMIC_RELEASE); }
static inline void bump32(const struct cip_ring* r, uint64_t off) {
  __atomic_store_n(w32(r, off), __atomic_load_n(w32(r, off), __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
}
#else
static inline void release_store32(const struct cip_ring* r, uint64_t off, uint32_t v) { store32(r, off, v); }
static inline void release_store64(const struct cip_ring* r, uint64_t off, uint64_t v) { __atomic_store_n(w64(r, off), v, __ATOMIC_SEQ_CST); }
static inline void bump32(const struct cip_ring* r, uint64_t off) { add32(r, off, 1); }
#endif

static inline uint64_t slot_off(const struct cip_ring* r, uint32_t s) { return r->slot_records_offset + (uint64_t)s * r->slot_record_bytes; }
static inline uint64_t part_off(const struct cip_ring* r, uint32_t k) { return r->participants_offset + (uint64_t)k * 64; }
static inline uint64_t ring_off(const struct cip_ring* r, uint64_t p) { return r->ring_offset + (p % r->slot_count) * 4; }
static inline uint32_t* taken_words(const struct cip_ring* r) { return (uint32_t*)(uintptr_t)r->taken; }

static int corrupt(struct cip_ring* r, uint32_t what, uint64_t a, uint64_t b) {
  r->error = what;
  r->error_a = a;
  r->error_b = b;
  return CIP_CORRUPT;
}

static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}

// ---- setup ----------------------------------------------------------------------------------

// 0 when every offset the functions below derive stays inside the mapping; else CIP_INVALID.
CIP_EXPORT int cip_ring_init(struct cip_ring* r) {
  uint64_t n = r->slot_count;
  if (!r->base || r->base % 8 || !r->taken || n < 1 || n > 65536 || r->max_participants < 2 || r->max_participants > 32 ||
      r->me >= r->max_participants || r->nbells > 32 || r->slot_record_bytes < S_META + (uint64_t)r->meta_bytes ||
      r->slot_record_bytes % 8 || r->participants_offset % 64 || r->ring_offset % 64 || r->slot_records_offset % 64)
    return CIP_INVALID;
  if (r->length < HEADER_BYTES || r->participants_offset < HEADER_BYTES ||
      r->participants_offset + (uint64_t)r->max_participants * 64 > r->length ||
      r->ring_offset + n * 4 > r->length || r->slot_records_offset + n * r->slot_record_bytes > r->length)
    return CIP_INVALID;
  r->hint %= r->slot_count;
  r->rotor &= 31;
  return 0;
}

// The end is closing: every later call returns CIP_CLOSED and rings no doorbell (their fds close next).
CIP_EXPORT void cip_ring_detach(struct cip_ring* r) {
  r->base = 0;
  r->nbells = 0;
}

// ---- wake-ups (section 5) -------------------------------------------------------------------

static void ring_bell(const struct cip_ring* r, uint32_t k) {
  if (k >= r->nbells || r->bells[k] < 0) return;
  uint64_t one = 1;
  // EAGAIN: the count is at its maximum, readable already; EBADF: nobody polls it any more.
  ssize_t done = write(r->bells[k], &one, sizeof one);
  (void)done;
}

static void wake(struct cip_ring* r, uint64_t mask_off, int all) {
  if (all) {
    uint32_t m = and32(r, mask_off, 0);
    for (uint32_t k = 0; m; k++, m >>= 1)
      if (m & 1) ring_bell(r, k);
    return;
  }
  uint32_t m = load32(r, mask_off);
  while (m) {
    uint32_t high = m & ~((UINT32_C(1) << r->rotor) - 1);
    uint32_t pick = high ? high : m;
    uint32_t k = (uint32_t)__builtin_ctz(pick);
    uint32_t bit = UINT32_C(1) << k;
    uint32_t old = and32(r, mask_off, ~bit);
    if (old & bit) {
      r->rotor = k + 1 == 32 ? 0 : k + 1;
      ring_bell(r, k);
      return;
    }
    m = old & ~bit;  // someone else woke k: try another
  }
}

static void signal_data(struct cip_ring* r, int all) {
  // A locked add: it also orders the publish's release stores (tail) before the sleepers' load.
  add32(r, H_DATA_SEQ, 1);
  if (load32(r, H_DATA_SLEEPERS) != 0) wake(r, H_DATA_SLEEPERS, all || r->broadcast);
}

static void signal_space(struct cip_ring* r) {
  // Every caller freed the slot with a locked operation just before (slot_ring.py, signal_space).
  bump32(r, H_SPACE_SEQ);
  if (load32(r, H_SPACE_SLEEPERS) != 0) wake(r, H_SPACE_SLEEPERS, 1);
}

CIP_EXPORT int cip_signal_data(struct cip_ring* r, int all) {
  if (!r->base) return CIP_CLOSED;
  signal_data(r, all);
  return 0;
}

CIP_EXPORT int cip_signal_space(struct cip_ring* r) {
  if (!r->base) return CIP_CLOSED;
  signal_space(r);
  return 0;
}

// ---- producers ------------------------------------------------------------------------------

static int claim_slot(struct cip_ring* r) {
  uint32_t n = r->slot_count, s = r->hint;
  uint32_t desired = KIND_WRITING | (r->me << 8);
  // The slot after the last one claimed is usually free (slots come back in the order they went
  // out): one compare-and-swap claims it. Loading its word first costs a second transfer of the
  // slot's line from the consumer that freed it (shared for the load, then the upgrade for the
  // swap), as slot-ring.ts says. Else the scan, which loads each word first.
  if (cas32(r, slot_off(r, s) + S_STATE, KIND_FREE, desired) == KIND_FREE) {
    r->hint = s + 1 == n ? 0 : s + 1;
    return (int)s;
  }
  for (uint32_t i = 0; i < n; i++) {
    uint64_t off = slot_off(r, s) + S_STATE;
    uint32_t v = load32(r, off);
    if ((v & 0xFF) == KIND_FREE && cas32(r, off, v, desired) == v) {
      r->hint = s + 1 == n ? 0 : s + 1;
      return (int)s;
    }
    s = s + 1 == n ? 0 : s + 1;
  }
  return CIP_NONE;
}

// A free slot claimed for writing, after producer.py's checks, in its order: this end alive, the
// consumers not all gone, (broadcast) every expected consumer attached. CIP_NONE: wait for space.
CIP_EXPORT int cip_acquire(struct cip_ring* r) {
  if (!r->base) return CIP_CLOSED;
  if (load32(r, part_off(r, r->me) + P_STATE) != ST_ALIVE) return CIP_NOT_ALIVE;
  if (load32(r, H_CONSUMERS_LIVE) == 0 && load32(r, H_CONSUMERS_ATTACHED) >= r->expect_consumers) return CIP_CONSUMERS_GONE;
  if (r->broadcast && load32(r, H_CONSUMERS_ATTACHED) < r->expect_consumers) return CIP_NONE;
  return claim_slot(r);
}

// More free slots claimed for writing, up to max, into out[] (producer.py acquire_many, after an
// acquire that made its checks): the count (0 when none is free).
CIP_EXPORT int cip_claim_slots(struct cip_ring* r, uint32_t* out, uint32_t max) {
  if (!r->base) return CIP_CLOSED;
  if (!out || max > 65536) return CIP_INVALID;
  uint32_t got = 0;
  int s;
  while (got < max && (s = claim_slot(r)) >= 0) out[got++] = (uint32_t)s;
  return (int)got;
}

// 1 when some slot is free (a scan that changes nothing).
CIP_EXPORT int cip_has_free(struct cip_ring* r) {
  if (!r->base) return CIP_CLOSED;
  for (uint32_t s = 0; s < r->slot_count; s++)
    if ((load32(r, slot_off(r, s) + S_STATE) & 0xFF) == KIND_FREE) return 1;
  return 0;
}

static int spin_lock(struct cip_ring* r, int64_t spin_ns) {
  uint32_t mine = r->me + 1;
  if (cas32(r, H_LOCK, 0, mine) == 0) return 1;
  int64_t deadline = now_ns() + spin_ns;
  for (uint32_t i = 1;; i++) {
    if (load32(r, H_LOCK) == 0 && cas32(r, H_LOCK, 0, mine) == 0) return 1;
    cpu_relax();
    if ((i & 63) == 0 && now_ns() >= deadline) return 0;
  }
}

// Writes the message's length and meta into slot s (this producer's, state writing), then
// publishes it (slot_ring.py: write_message, then publish). PUB_* or CIP_CORRUPT / CIP_INVALID / CIP_CLOSED.
// meta: meta_len bytes (NULL when 0).
static int commit(struct cip_ring* r, uint32_t s);

static int publish(struct cip_ring* r, uint32_t s, uint64_t length, uint32_t meta_kind, const uint8_t* meta, uint32_t meta_len) {
  if (!r->base) return CIP_CLOSED;
  if (s >= r->slot_count || meta_len > r->meta_bytes || (meta_len && !meta) || meta_kind > META_KIND_MAX) return CIP_INVALID;
  uint64_t so = slot_off(r, s);
  if (meta_len) memcpy((uint8_t*)(uintptr_t)(r->base + so + S_META), meta, meta_len);
  __atomic_store_n(w64(r, so + S_LENGTH), length, __ATOMIC_RELAXED);
  set_plain32(r, so + S_META_LENGTH, meta_len);
  set_plain32(r, so + S_META_KIND, meta_kind);
  return commit(r, s);
}

// The publish itself (slot_ring.py publish; slot-ring.ts Ring.publish): slot s's record is written.
static int commit(struct cip_ring* r, uint32_t s) {
  uint64_t so = slot_off(r, s);
  uint32_t me = r->me;
  // A free lock is taken with one swap; only a busy one pays for the spin (200 us, LOCK_SPIN).
  if (cas32(r, H_LOCK, 0, me + 1) != 0 && !spin_lock(r, 200000)) return PUB_BUSY;
  int result = PUB_OK;
  uint32_t writing = KIND_WRITING | (me << 8);
  int64_t t = load64(r, H_TAIL);
  if (t < 0) {
    result = corrupt(r, ERR_TAIL, 0, 0);
  } else {
    set_plain32(r, so + S_PUBLISHER, me);
    set_plain32(r, so + S_DELIVERIES, 0);
    // Release stores: the commit's swap below, and signal_data's add after the unlock, are the
    // locked operations that order them before every load that follows.
    release_store64(r, so + S_POSITION, (uint64_t)t);
    int done = 0;
    if (r->broadcast) {
      uint32_t mask = load32(r, H_CONSUMER_MASK);
      set_plain32(r, so + S_LAST_HOLDERS, mask);
      store32(r, so + S_HOLDERS, mask);
      if (mask == 0) {
        result = cas32(r, so + S_STATE, writing, KIND_FREE) == writing ? PUB_DROPPED : PUB_DETACHED;
        done = 1;
      }
    }
    if (!done) {
      // The commit point: a swap, so that a slot recovery took back is never published over.
      uint32_t published = KIND_PUBLISHED | (me << 8) | (uint32_t)((uint64_t)t % 0x8000) << GEN_SHIFT;
      if (cas32(r, so + S_STATE, writing, published) != writing) {
        result = PUB_DETACHED;
      } else {
        release_store32(r, ring_off(r, (uint64_t)t), s);
        release_store64(r, H_TAIL, (uint64_t)t + 1);
      }
    }
  }
  release_store32(r, H_LOCK, 0);
  if (result == PUB_DROPPED) signal_space(r);
  else if (result == PUB_OK) signal_data(r, 0);
  return result;
}

// Publishes slot s (this producer's, state writing) whose length and meta its caller wrote into the
// record already (the Node producer writes them straight into the slot record, as slot-ring.ts's
// callers do): the commit alone. PUB_* or CIP_CORRUPT / CIP_INVALID / CIP_CLOSED.
CIP_EXPORT int cip_publish_written(struct cip_ring* r, uint32_t s) {
  if (!r->base) return CIP_CLOSED;
  if (s >= r->slot_count) return CIP_INVALID;
  return commit(r, s);
}

// publish(); a length of 2^32 or more comes as two words.
CIP_EXPORT int cip_publish(struct cip_ring* r, uint32_t s, uint32_t length_lo, uint32_t length_hi, uint32_t meta_kind,
                           const uint8_t* meta, uint32_t meta_len) {
  return publish(r, s, (uint64_t)length_hi << 32 | length_lo, meta_kind, meta, meta_len);
}

// cip_publish of a message without meta and of a length below 2^31 (ctypes converts each argument: three cost less than seven).
CIP_EXPORT int cip_publish_bare(struct cip_ring* r, uint32_t s, int32_t length) {
  if (length < 0) return CIP_INVALID;
  return publish(r, s, (uint64_t)length, 0, NULL, 0);
}

// cip_publish_bare for slots[0..count) in turn (producer.py publish_many), until one does not go
// through (PUB_BUSY or PUB_DETACHED, or a negative result): the number that did (PUB_OK or
// PUB_DROPPED), and the result of the one that stopped it in *stopped (PUB_OK when none did).
CIP_EXPORT int cip_publish_many(struct cip_ring* r, const uint32_t* slots, uint32_t count, int32_t length, int32_t* stopped) {
  if (!r->base) return CIP_CLOSED;
  if (!slots || !stopped || length < 0 || count > 65536) return CIP_INVALID;
  *stopped = PUB_OK;
  for (uint32_t i = 0; i < count; i++) {
    int rc = publish(r, slots[i], (uint64_t)length, 0, NULL, 0);
    if (rc != PUB_OK && rc != PUB_DROPPED) {
      *stopped = rc;
      return (int)i;
    }
  }
  return (int)count;
}

// Gives back a claimed slot not published.
CIP_EXPORT int cip_discard(struct cip_ring* r, uint32_t s) {
  if (!r->base) return CIP_CLOSED;
  if (s >= r->slot_count) return CIP_INVALID;
  uint32_t word = KIND_WRITING | (r->me << 8);
  if (cas32(r, slot_off(r, s) + S_STATE, word, KIND_FREE) == word) signal_space(r);
  return 0;
}

// ---- consumers ------------------------------------------------------------------------------

static int64_t pos(struct cip_ring* r, uint64_t off) { return load64(r, off); }

// Work sharing: takes the oldest published message (slot_ring.py take). The slot, CIP_NONE or CIP_CORRUPT.
static int take_one(struct cip_ring* r) {
  uint32_t n = r->slot_count;
  uint32_t* taken = taken_words(r);
  int64_t t = (int64_t)r->tail_seen;
  for (uint32_t round = 0; round < 4 * n + 64; round++) {
    int64_t h = load64(r, H_HEAD);
    if (h >= t || h < 0) {
      // Tail first, then head again: both only grow, so t - h <= slots.
      t = pos(r, H_TAIL);
      if (t < 0) return corrupt(r, ERR_TAIL, 0, 0);
      r->tail_seen = (uint64_t)t;
      h = pos(r, H_HEAD);
      if (h < 0) return corrupt(r, ERR_HEAD, 0, 0);
      if (h >= t) return CIP_NONE;
    }
    if ((uint64_t)(t - h) > n) return corrupt(r, ERR_SPAN, (uint64_t)(t - h), n);
    uint32_t s = load32(r, ring_off(r, (uint64_t)h));
    if (s >= n) return corrupt(r, ERR_RING_SLOT, s, n);
    uint64_t so = slot_off(r, s);
    uint32_t word = load32(r, so);
    // The generation in the word ties it to position h (no ABA).
    if ((word & 0xFF) == KIND_PUBLISHED && (word & GEN_MASK) == (uint32_t)((uint64_t)h % 0x8000) << GEN_SHIFT &&
        load64(r, so + S_POSITION) == h) {
      uint32_t mine = KIND_TAKEN | (r->me << 8) | (word & 0xFFFF0000u);
      if (cas32(r, so, word, mine) == word) {
        taken[s] = mine;
        cas64(r, H_HEAD, (uint64_t)h, (uint64_t)h + 1);
        set_plain32(r, so + S_DELIVERIES, plain32(r, so + S_DELIVERIES) + 1);
        return (int)s;
      }
      continue;
    }
    cas64(r, H_HEAD, (uint64_t)h, (uint64_t)h + 1);  // position h was taken (its taker may not have advanced head yet)
  }
  return CIP_NONE;
}

static inline int alive(const struct cip_ring* r) { return load32(r, part_off(r, r->me) + P_STATE) == ST_ALIVE; }

// Fills m from slot s's record (s taken by this participant, so its publisher's fields stay put);
// 0, or CIP_TAKEN_BAD (set in m->slot too) when they do not fit the layout.
static int read_message(const struct cip_ring* r, uint32_t s, struct cip_message* m) {
  uint64_t so = slot_off(r, s);
  uint64_t slot_bytes = (uint64_t)r->slot_bytes_hi << 32 | r->slot_bytes_lo;
  uint64_t position = __atomic_load_n(w64(r, so + S_POSITION), __ATOMIC_RELAXED);
  memset(m, 0, sizeof *m);
  m->slot = s;
  m->position = position <= MAX_U53 ? (int64_t)position : -1;
  m->length = __atomic_load_n(w64(r, so + S_LENGTH), __ATOMIC_RELAXED);
  m->publisher = plain32(r, so + S_PUBLISHER);
  m->redelivered = (taken_words(r)[s] & FLAG_REDELIVERED) != 0;
  m->ticket = plain32(r, so + S_TICKET);
  m->meta_kind = plain32(r, so + S_META_KIND);
  m->meta_length = plain32(r, so + S_META_LENGTH);
  if (m->length <= slot_bytes && m->meta_length <= r->meta_bytes && m->meta_kind <= META_KIND_MAX) return 0;
  m->slot |= CIP_TAKEN_BAD;
  return CIP_TAKEN_BAD;
}

// Work sharing: takes the oldest published message into *m (its slot and record): the slot, with
// CIP_TAKEN_DETACHED set when this end was found detached right after taking it (consumer.py hands
// it back then) and CIP_TAKEN_BAD when its record does not fit the layout (consumer.py gives the slot
// back and raises); CIP_NONE, CIP_CORRUPT, CIP_CLOSED.
CIP_EXPORT int cip_take_message(struct cip_ring* r, struct cip_message* m) {
  if (!r->base) return CIP_CLOSED;
  if (!m) return CIP_INVALID;
  int s = take_one(r);
  if (s < 0) return s;
  s |= read_message(r, (uint32_t)s, m);
  if (!alive(r)) s |= CIP_TAKEN_DETACHED;
  m->slot = (uint32_t)s;
  return s;
}

// Work sharing: takes up to max messages into out[] (oldest first); the count, with
// CIP_TAKEN_DETACHED set when this end was found detached after taking them, and CIP_TAKEN_BAD when
// the last one's record does not fit the layout (it stops there; its slot has the flag too). CIP_CORRUPT only when it took none
// (a later call meets the inconsistency again).
CIP_EXPORT int cip_take_messages(struct cip_ring* r, struct cip_message* out, uint32_t max) {
  if (!r->base) return CIP_CLOSED;
  if (!out || max > 65536) return CIP_INVALID;
  uint32_t got = 0;
  int flags = 0;
  while (got < max && !flags) {
    int s = take_one(r);
    if (s < 0) {
      if (s == CIP_CORRUPT && got == 0) return s;
      break;
    }
    flags = read_message(r, (uint32_t)s, &out[got++]);
  }
  if (got && !alive(r)) flags |= CIP_TAKEN_DETACHED;
  return (int)got | flags;
}

// Work sharing: frees a slot this participant took: 1, or 0 when it no longer held it.
CIP_EXPORT int cip_release(struct cip_ring* r, uint32_t s) {
  if (!r->base) return CIP_CLOSED;
  if (s >= r->slot_count) return CIP_INVALID;
  uint32_t word = taken_words(r)[s];
  if (cas32(r, slot_off(r, s) + S_STATE, word, KIND_FREE) != word) return 0;
  signal_space(r);
  return 1;
}

// Broadcast: the slot published at cursor (lo | hi << 32); CIP_NONE nothing there yet, CIP_SKIP
// not held for this participant (skip it), CIP_CORRUPT.
CIP_EXPORT int cip_peek(struct cip_ring* r, uint32_t cursor_lo, uint32_t cursor_hi) {
  if (!r->base) return CIP_CLOSED;
  uint64_t cursor = (uint64_t)cursor_hi << 32 | cursor_lo;
  uint64_t t = r->tail_seen;
  if (cursor >= t) {
    int64_t tt = pos(r, H_TAIL);
    if (tt < 0) return corrupt(r, ERR_TAIL, 0, 0);
    t = r->tail_seen = (uint64_t)tt;
    if (cursor >= t) return CIP_NONE;
  }
  if (t - cursor > r->slot_count) return corrupt(r, ERR_AHEAD, t - cursor, r->slot_count);
  uint32_t s = load32(r, ring_off(r, cursor));
  if (s >= r->slot_count) return corrupt(r, ERR_RING_SLOT, s, r->slot_count);
  uint64_t so = slot_off(r, s);
  if (load64(r, so + S_POSITION) != (int64_t)cursor || !(load32(r, so + S_HOLDERS) & (UINT32_C(1) << r->me))) return CIP_SKIP;
  return (int)s;
}

// Broadcast: drops participant k's hold on slot s; the last holder frees it. 1, or 0 when k held none.
CIP_EXPORT int cip_release_held(struct cip_ring* r, uint32_t s, uint32_t k) {
  if (!r->base) return CIP_CLOSED;
  if (s >= r->slot_count || k >= 32) return CIP_INVALID;
  uint32_t bit = UINT32_C(1) << k;
  uint64_t so = slot_off(r, s);
  uint32_t old = and32(r, so + S_HOLDERS, ~bit);
  if (!(old & bit)) return 0;
  if (!(old & ~bit)) {
    uint32_t word = load32(r, so + S_STATE);
    if ((word & 0xFF) == KIND_PUBLISHED) cas32(r, so + S_STATE, word, KIND_FREE);
    signal_space(r);
  }
  return 1;
}

// ---- waiting --------------------------------------------------------------------------------

// Spins while the 32-bit word at off equals expected, up to ns nanoseconds: 1 when it changed, 0
// when the time ran out (waiter.py's spin before sleeping). Called without the GIL. Loads between
// pauses keep the pauses far apart: a hypervisor may take a run of close pauses for a vCPU spinning
// on a descheduled lock holder and exit to the host (native/channel.cc, SpinWhileEqual).
CIP_EXPORT int cip_spin_while_equal(struct cip_ring* r, uint32_t off, uint32_t expected, uint32_t ns) {
  if (!r->base) return CIP_CLOSED;
  if (off % 4 || (uint64_t)off + 4 > r->length) return CIP_INVALID;
  const uint32_t* w = w32(r, off);
  if (__atomic_load_n(w, __ATOMIC_SEQ_CST) != expected) return 1;
  int64_t deadline = now_ns() + (int64_t)(ns > 100000000u ? 100000000u : ns);
  for (uint32_t round = 1;; round++) {
    for (int i = 0; i < 256; i++)
      if (__atomic_load_n(w, __ATOMIC_SEQ_CST) != expected) return 1;
    cpu_relax();
    if (round % 8 == 0 && now_ns() >= deadline) return 0;
  }
}
