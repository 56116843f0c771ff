/*
 * vkgdr.h: the C API of vkgdr (libvkgdr.so.1 / libvkgdr.a). GENERATED from capi/src by cbindgen
 * (capi/tests/header.rs checks it); do not edit by hand.
 *
 * A drop-in for vkgdr 0.1's vkgdr.h (same names, values, signatures and error texts), plus pools
 * (vkgdr_pool_*, vkgdr_block_*), copies (vkgdr_copy_*), rings (vkgdr_ring_*) with their
 * exclusive producers (vkgdr_ring_producer_*), device -> host rings whose records kernels
 * publish and C threads take (vkgdr_d2h_ring_*) and pool blocks kernels give back
 * (vkgdr_block_release_on_device), frees that never wait for a running kernel
 * (vkgdr_memory_free_after, vkgdr_memory_free_now, vkgdr_block_free_after,
 * vkgdr_ring_watch_consumer, vkgdr_wait_for_releases, vkgdr_get_release_times), what a handle
 * keeps for later allocations given back (vkgdr_trim) and limited (vkgdr_get_spare_limits,
 * vkgdr_set_spare_limits), and sharing memory, pool blocks and ring
 * lanes with other processes over a Unix socket: the owner's side (vkgdr_share_*) and the side
 * that attaches (vkgdr_peer_*, vkgdr_attached_*, vkgdr_shared_block_*), which needs no CUDA.
 *
 * Conventions: a failing call returns NULL, 0, false or VKGDR_ERROR (each function says which)
 * and sets the calling thread's last error, vkgdr_last_error(). As in vkgdr 0.1, a successful
 * call leaves it alone: only vkgdr_open, vkgdr_open_vulkan and vkgdr_memory_alloc clear it, first
 * thing. Unknown vkgdr_open_flags bits and vkgdr_memory_alloc flags are ignored, as in 0.1.
 * Handles are checked: NULL, a freed handle or one of another type is an error, never a crash
 * (freeing a handle while another thread still uses it is the one misuse that cannot be caught).
 * Destructors ignore NULL. No function lets an internal failure escape as a crash.
 */

#ifndef VKGDR_H
#define VKGDR_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#define VKGDR_API __attribute__((visibility("default")))

#if defined(__cplusplus) && defined(VKGDR_RING_CUH) && !defined(VKGDR_RING_NO_SHORT_NAME)
#error "include vkgdr.h before vkgdr/ring.cuh: ring.cuh's short namespace name vkgdr:: would clash with vkgdr.h's handle type struct vkgdr (or define VKGDR_RING_NO_SHORT_NAME and write vkgdr_device::)"
#endif

/**
 * Returned by functions that report success as an `int`.
 */
#define VKGDR_SUCCESS 0

/**
 * Returned by functions that report failure as an `int`; the reason is in `vkgdr_last_error()`.
 */
#define VKGDR_ERROR -1

/**
 * `vkgdr_d2h_ring_try_next` and `vkgdr_d2h_ring_next` found no record (none has arrived yet, or
 * none within the timeout): nothing was taken, try again later.
 */
#define VKGDR_D2H_RING_EMPTY 1

/**
 * `vkgdr_d2h_ring_try_next` and `vkgdr_d2h_ring_next` found no record, and none will come: the
 * producers were declared finished (`vkgdr_d2h_ring_finish`) and every record they published
 * was taken.
 */
#define VKGDR_D2H_RING_ENDED 2

/**
 * `vkgdr_d2h_ring_create_with_format`'s `format`: each slot a commit word, stored after a
 * release fence, then the meta word and `stride - 16` payload bytes (`vkgdr_d2h_ring_create`'s
 * format; the same value as `ring_d2h.cuh`'s macro).
 */
#define VKGDR_D2H_FORMAT_COMMITTED 0

/**
 * `vkgdr_d2h_ring_create_with_format`'s `format`: every 8-byte word of a slot carries four
 * bytes and its record's tag, so a record needs no fence before it counts and reaches the CPU
 * a PCIe round trip sooner, at `stride / 2 - 8` payload bytes per slot (NCCL's low-latency
 * protocol, device to host).
 */
#define VKGDR_D2H_FORMAT_TAGGED 1

/**
 * Bytes of `vkgdr_slow_release.what`, its NUL included.
 */
#define VKGDR_SLOW_RELEASE_WHAT 64

/**
 * `vkgdr_ring_push` found no room before its timeout: nothing was written, try again later.
 */
#define VKGDR_RING_FULL 1

/**
 * Nothing there (yet): no event before the timeout (`vkgdr_share_next_event`), no block given
 * back under that token (`vkgdr_share_take_returned`), no block sent before the timeout
 * (`vkgdr_attached_pool_next_block`). Not an error: the last error is left alone.
 */
#define VKGDR_SHARE_NONE 1

/**
 * Bytes of `vkgdr_share_event.text`, its NUL included.
 */
#define VKGDR_SHARE_EVENT_TEXT 512

/**
 * Valid flags to pass to `vkgdr_open` (and, except `VKGDR_OPEN_CURRENT_CONTEXT_BIT`, to
 * `vkgdr_open_vulkan`). Other bits are ignored, as in vkgdr 0.1.
 */
typedef enum vkgdr_open_flags {
  /**
   * Ignore the given device and use the calling thread's current CUDA context instead.
   */
  VKGDR_OPEN_CURRENT_CONTEXT_BIT = 1,
  /**
   * Treat the memory as non-coherent even if it is coherent (for debugging only).
   */
  VKGDR_OPEN_FORCE_NON_COHERENT_BIT = 2,
  /**
   * Fail unless the memory is guaranteed to be coherent.
   */
  VKGDR_OPEN_REQUIRE_COHERENT_BIT = 4,
} vkgdr_open_flags;

/**
 * Flags of `vkgdr_ring_create`.
 */
typedef enum vkgdr_ring_flags {
  /**
   * Map the data region twice back to back (CUDA VMM), so records run over the end with no
   * padding and a consumer reads each one contiguously (the `_mirrored` consumers of
   * `kernels/ring.cu`). `capacity` must then be a multiple of the VMM granularity (2 MiB).
   */
  VKGDR_RING_MIRRORED_BIT = 1,
  /**
   * Give each lane an allocation of its own, so that lanes can be lent to producers in other
   * processes (`vkgdr_share_ring`): a peer sent one lane's memory reaches no other lane's
   * records, and never the ring's control words. Padded rings only (not with
   * `VKGDR_RING_MIRRORED_BIT`), without the copy engine; `capacity` is rounded up to the VMM
   * granularity (2 MiB on the H100) in memory, not in the ring's size. Consumers are the same
   * kernels as for other rings.
   */
  VKGDR_RING_SHAREABLE_BIT = 2,
  /**
   * Split the lanes between the two paths of `vkgdr_ring_options.copy_engine_record`
   * (`vkgdr_ring_create_with_options` only, with a non-zero `copy_engine_record`): three lanes
   * in eight (those whose index modulo 8 is 0, 3 or 6) write records below 8 KiB through the
   * BAR, the others stage records of at least `copy_engine_record` bytes in pinned memory for
   * the copy engine: eight producers of 1 and 2 KiB records then drive both paths at once
   * (figures: BENCHMARKS.md, 'Lanes split between the BAR and the copy engine'). Producers
   * claim lanes in order: a ring's first producer takes the BAR, its second and third the copy
   * engine. Not with `VKGDR_RING_SHAREABLE_BIT`.
   */
  VKGDR_RING_COPY_ENGINE_SPLIT_BIT = 4,
  /**
   * Every record through the BAR, on every lane (`vkgdr_ring_create_with_options` only,
   * with a `copy_engine_record` of 0, not with `VKGDR_RING_COPY_ENGINE_SPLIT_BIT`). Without
   * it and with a `copy_engine_record` of 0 the ring chooses: on a ring of two lanes or more,
   * lanes 0, 3 and 6 of each eight stage records of 8 KiB and more and the others records
   * of 1 KiB and more (header included), once a producer's batch has 64 KiB pending before
   * them, unless the lanes' pinned staging copies would hold more than 256 MiB in all.
   */
  VKGDR_RING_COPY_ENGINE_OFF_BIT = 8,
} vkgdr_ring_flags;

/**
 * `vkgdr_pool_stats.thread_cache_handshake`: how other threads (a trim, the pool's destruction)
 * get at a thread's cache of freed blocks, chosen once per process.
 */
typedef enum vkgdr_thread_cache_handshake {
  /**
   * The pool has no thread cache (`vkgdr_pool_config.thread_cache` 0).
   */
  VKGDR_THREAD_CACHE_OFF = 0,
  /**
   * Linux's `membarrier` on the other thread's side: no barrier on a thread's own cached
   * allocations and frees.
   */
  VKGDR_THREAD_CACHE_MEMBARRIER = 1,
  /**
   * `membarrier` cannot be used here: a full memory barrier on each cached allocation and
   * free.
   */
  VKGDR_THREAD_CACHE_FENCE = 2,
} vkgdr_thread_cache_handshake;

/**
 * `vkgdr_share_options.peers`: who may attach.
 */
typedef enum vkgdr_share_peers {
  /**
   * Processes of this process's effective uid (checked with `SO_PEERCRED`): the default.
   */
  VKGDR_SHARE_PEERS_SAME_USER = 0,
  /**
   * Anyone who can open the socket: its file mode (`socket_mode`) is the only gate.
   */
  VKGDR_SHARE_PEERS_ANY_USER = 1,
  /**
   * Processes of the uids in `vkgdr_share_options.uids`.
   */
  VKGDR_SHARE_PEERS_UIDS = 2,
} vkgdr_share_peers;

/**
 * `vkgdr_share_event.kind`: what happened.
 */
typedef enum vkgdr_share_event_kind {
  /**
   * A peer connected and was let in: `peer`, `pid`, `uid`.
   */
  VKGDR_SHARE_EVENT_CONNECTED = 1,
  /**
   * A process was turned away by the policy (`vkgdr_share_options.peers`): `pid`, `uid`, and
   * the rule in `text`.
   */
  VKGDR_SHARE_EVENT_REFUSED = 2,
  /**
   * A peer attached a region: `peer`, `attachment`, the region's name in `text`.
   */
  VKGDR_SHARE_EVENT_ATTACHED = 3,
  /**
   * A peer's request was refused (a name nothing is shared under, a pool's quota, every lane
   * taken): `peer`, the owner's words in `text`.
   */
  VKGDR_SHARE_EVENT_REQUEST_REFUSED = 4,
  /**
   * A peer detached an attachment: `peer`, `attachment`.
   */
  VKGDR_SHARE_EVENT_DETACHED = 5,
  /**
   * A peer gave a pool block back: `peer`, `token` (for `vkgdr_share_take_returned`).
   */
  VKGDR_SHARE_EVENT_RELEASED = 6,
  /**
   * A remote producer published a tail the owner refused: its lane is out of service until
   * it detaches or dies. `peer`, `lane`, what was wrong in `text`.
   */
  VKGDR_SHARE_EVENT_LANE_FAULT = 7,
  /**
   * A peer sent something the protocol does not allow and was disconnected: `peer`, what it
   * sent in `text`.
   */
  VKGDR_SHARE_EVENT_MISBEHAVED = 8,
  /**
   * A peer is gone (hung up, died, revoked or disconnected); everything it held went back:
   * `peer`, `pid`.
   */
  VKGDR_SHARE_EVENT_GONE = 9,
  /**
   * An event this version of the header does not name; `text` describes it.
   */
  VKGDR_SHARE_EVENT_OTHER = 255,
} vkgdr_share_event_kind;

/**
 * Opaque handle to a device → host ring, from `vkgdr_d2h_ring_create`; freed with
 * `vkgdr_d2h_ring_destroy`.
 */
typedef struct vkgdr_d2h_ring *vkgdr_d2h_ring_t;

/**
 * Opaque handle to the library, from `vkgdr_open` or `vkgdr_open_vulkan`; freed with
 * `vkgdr_close`.
 */
typedef struct vkgdr *vkgdr_t;

/**
 * What a producing kernel takes by value: exactly `vkgdr_d2h_view` of
 * `include/vkgdr/ring_d2h.cuh` (48 bytes, a wire format, so no `struct_size`). Pass a pointer
 * to it as the kernel's parameter (`cuLaunchKernel`'s `kernelParams` entry).
 */
typedef struct vkgdr_d2h_ring_device_view {
  /**
   * Device address of lane 0's slots (host memory mapped for the device); lane `i`'s are
   * `i * slots_per_lane * stride` bytes further.
   */
  uint64_t slots;
  /**
   * Device address of lane 0's control block (`head`, `closed`); lane `i`'s is
   * `i * VKGDR_D2H_CONTROL_STRIDE` (128) bytes further.
   */
  uint64_t control;
  /**
   * Device address of lane 0's device state (`reserve`, `head_cache`, `gave_up`); lane `i`'s
   * is `i * VKGDR_D2H_DEVICE_STRIDE` (128) bytes further.
   */
  uint64_t device;
  /**
   * Slots per lane (a power of two).
   */
  uint32_t slots_per_lane;
  /**
   * Bytes per slot (a power of two): a record carries up to `stride - 16` payload bytes
   * (`stride / 2 - 8` in the tagged format).
   */
  uint32_t stride;
  /**
   * Number of lanes.
   */
  uint32_t lanes;
  /**
   * Looks at a full lane's head, with no progress, before a publication gives up
   * (`VKGDR_D2H_STALLED`).
   */
  uint32_t spin_limit;
  /**
   * How the slots carry their records: `VKGDR_D2H_FORMAT_COMMITTED` or
   * `VKGDR_D2H_FORMAT_TAGGED`.
   */
  uint32_t format;
  /**
   * Reserved, zero.
   */
  uint32_t reserved;
} vkgdr_d2h_ring_device_view;

/**
 * One record taken by `vkgdr_d2h_ring_try_next` or `vkgdr_d2h_ring_next` (its payload is
 * copied into the caller's buffer). Set `struct_size` to `sizeof(vkgdr_d2h_record)` before the
 * call.
 */
typedef struct vkgdr_d2h_record {
  /**
   * `sizeof(vkgdr_d2h_record)` as the caller was compiled.
   */
  size_t struct_size;
  /**
   * The record's sequence number in its lane: 0, 1, 2, ... in the device's reservation order.
   */
  uint64_t seq;
  /**
   * The kind the kernel gave it (kinds from `VKGDR_D2H_KIND_RESERVED`, 0x80000000, up are the
   * library's own).
   */
  uint32_t kind;
  /**
   * Payload bytes copied into the buffer.
   */
  uint32_t len;
} vkgdr_d2h_record;

/**
 * A lane's counters (`vkgdr_d2h_ring_get_lane_stats`). Set `struct_size` to
 * `sizeof(vkgdr_d2h_lane_stats)` before the call.
 */
typedef struct vkgdr_d2h_lane_stats {
  /**
   * `sizeof(vkgdr_d2h_lane_stats)` as the caller was compiled.
   */
  size_t struct_size;
  /**
   * Records the kernels reserved in the lane (each is committed with no wait in between).
   */
  uint64_t reserved;
  /**
   * Records the lane's consumers took (its `head`).
   */
  uint64_t taken;
  /**
   * Publications that gave up (`VKGDR_D2H_CLOSED` or `VKGDR_D2H_STALLED`).
   */
  uint64_t gave_up;
} vkgdr_d2h_lane_stats;

/**
 * One release and how long it took, or has taken so far (a field of `vkgdr_release_times`).
 * All zero when there is none: `what[0] == 0` says so.
 */
typedef struct vkgdr_slow_release {
  /**
   * How long, in nanoseconds; 0 when there is none.
   */
  uint64_t time_ns;
  /**
   * What was released: the library's type name without module paths (`Backing`,
   * `Arc<RingMemory>`, `ReleasedChunk`), NUL-terminated, cut at a UTF-8 character when longer
   * than `VKGDR_SLOW_RELEASE_WHAT - 1` bytes; empty when there is none.
   */
  char what[VKGDR_SLOW_RELEASE_WHAT];
} vkgdr_slow_release;

/**
 * How the releases of a handle's memory went (`vkgdr_get_release_times`): those waiting now,
 * and the slowest so far. Set `struct_size` to `sizeof(vkgdr_release_times)` before the call.
 *
 * Only releases that waited in the release queue count: one whose GPU work was done when it
 * was made frees its memory at once. A queued release first waits for the GPU work queued
 * before it (on the legacy and blocking streams, or on the stream named to a `_free_after`
 * call or `vkgdr_ring_watch_consumer`): one that waits for seconds names work that does not
 * end, such as a kernel there that runs on. Then it waits for its turn: the queue hands out
 * one release at a time to whichever thread polls, so a drop that takes long (unmapping a
 * large allocation) holds back the releases behind it.
 */
typedef struct vkgdr_release_times {
  /**
   * `sizeof(vkgdr_release_times)` as the caller was compiled.
   */
  size_t struct_size;
  /**
   * Releases waiting now, for their GPU work or in a drop (what `vkgdr_wait_for_releases`
   * counts).
   */
  uint64_t waiting;
  /**
   * The queued release that has waited longest of those waiting now (for its GPU work, or
   * for its turn to be dropped), and for how long so far.
   */
  struct vkgdr_slow_release oldest_waiting;
  /**
   * The drop under way now that began first, and how long it has taken so far.
   */
  struct vkgdr_slow_release longest_dropping;
  /**
   * The longest any release waited for the GPU work queued before it (as often as the queue
   * looked: at least every millisecond, and between two drops).
   */
  struct vkgdr_slow_release longest_wait;
  /**
   * The longest a release whose GPU work was done waited for its turn to be dropped: behind
   * other drops, until a thread that polls took it.
   */
  struct vkgdr_slow_release longest_turn;
  /**
   * The longest the drop of released memory took (unmapping it, giving it back to the
   * driver or its pool).
   */
  struct vkgdr_slow_release longest_drop;
} vkgdr_release_times;

/**
 * Opaque handle to a pool, from `vkgdr_pool_create`; freed with `vkgdr_pool_destroy`.
 */
typedef struct vkgdr_pool *vkgdr_pool_t;

/**
 * Opaque handle to a block of a pool, from `vkgdr_pool_alloc`; freed with `vkgdr_block_free`.
 */
typedef struct vkgdr_block *vkgdr_block_t;

/**
 * Opaque handle to a memory allocation, from `vkgdr_memory_alloc`; freed with
 * `vkgdr_memory_free`.
 */
typedef struct vkgdr_memory *vkgdr_memory_t;

/**
 * Opaque handle to a connection to an owner's share server, from `vkgdr_peer_connect`; freed
 * with `vkgdr_peer_destroy`.
 */
typedef struct vkgdr_peer *vkgdr_peer_t;

/**
 * Opaque handle to raw memory an owner shares, from `vkgdr_peer_attach_memory`; freed with
 * `vkgdr_attached_memory_detach`.
 */
typedef struct vkgdr_attached_memory *vkgdr_attached_memory_t;

/**
 * Opaque handle to a pool an owner shares, from `vkgdr_peer_attach_pool`; freed with
 * `vkgdr_attached_pool_detach`.
 */
typedef struct vkgdr_attached_pool *vkgdr_attached_pool_t;

/**
 * Opaque handle to a block of an owner's pool lent to this process, from
 * `vkgdr_attached_pool_request` or `vkgdr_attached_pool_next_block`; given back with
 * `vkgdr_shared_block_release`.
 */
typedef struct vkgdr_shared_block *vkgdr_shared_block_t;

/**
 * Opaque handle to a lane of an owner's ring that this process produces into, from
 * `vkgdr_peer_attach_lane`; freed with `vkgdr_attached_lane_detach`.
 */
typedef struct vkgdr_attached_lane *vkgdr_attached_lane_t;

/**
 * How a pool sizes, grows and trims its chunks. Fill it with `vkgdr_pool_config_init`, then
 * change what you need. Later versions may add fields at the end: `struct_size` tells the
 * library which ones the caller knows.
 */
typedef struct vkgdr_pool_config {
  /**
   * `sizeof(vkgdr_pool_config)` as the caller was compiled (set by `vkgdr_pool_config_init`).
   */
  size_t struct_size;
  /**
   * Size of a shard's first chunk in bytes (default 16 MiB); a multiple of `max_align`.
   */
  uint64_t chunk_size;
  /**
   * Each new chunk of a shard doubles the previous one, up to this size (default 256 MiB).
   */
  uint64_t max_chunk_size;
  /**
   * Requests of at least this many bytes get a chunk of their own (default 8 MiB).
   */
  uint64_t dedicated_threshold;
  /**
   * Total bytes of chunks the pool may hold; beyond it allocations fail (default: no limit,
   * `UINT64_MAX`).
   */
  uint64_t max_bytes;
  /**
   * Independent heaps; threads are spread over them, and each is made when a thread first
   * allocates from it (default: CPU count, at most 64).
   */
  uint32_t shards;
  /**
   * Empty chunks each shard keeps for reuse instead of freeing them at once (default 1).
   */
  uint32_t keep_empty_chunks;
  /**
   * Freed blocks of up to 4 KiB each thread keeps per size class for reuse without any lock
   * (default 32; 0 turns the cache off), at most `thread_cache_bytes` per thread and pool.
   * Cached blocks stay reserved until they are reused, `vkgdr_pool_trim` (from any thread) or
   * `vkgdr_pool_destroy` takes them back from every thread (idle ones included), or their
   * thread exits.
   */
  uint32_t thread_cache;
  /**
   * Must be 0.
   */
  uint32_t flags;
  /**
   * Bytes (rounded block sizes) each thread keeps cached for this pool at most (default
   * 256 KiB). A caller whose `struct_size` ends before this field gets the default.
   */
  uint64_t thread_cache_bytes;
  /**
   * Largest alignment `vkgdr_pool_alloc` accepts, and the alignment of every chunk's base
   * address: a power of two (default 64 KiB). A caller whose `struct_size` ends before this
   * field gets the default.
   */
  uint64_t max_align;
} vkgdr_pool_config;

/**
 * A usage snapshot of a pool (`vkgdr_pool_get_stats`). Set `struct_size` to
 * `sizeof(vkgdr_pool_stats)` before the call.
 */
typedef struct vkgdr_pool_stats {
  /**
   * `sizeof(vkgdr_pool_stats)` as the caller was compiled.
   */
  size_t struct_size;
  /**
   * Bytes of all chunks held, dedicated ones included.
   */
  uint64_t bytes_reserved;
  /**
   * Bytes requested by live blocks in shared chunks (blocks kept in thread caches excluded:
   * see `bytes_cached`).
   */
  uint64_t bytes_in_use;
  /**
   * Bytes handed out (rounded sizes) in shared chunks.
   */
  uint64_t bytes_allocated;
  /**
   * Shared chunks held.
   */
  uint64_t chunks;
  /**
   * Dedicated chunks held (one per large block).
   */
  uint64_t dedicated_chunks;
  /**
   * Largest free block in any shard.
   */
  uint64_t largest_free_block;
  /**
   * Bytes requested by freed blocks that thread caches keep for reuse (see
   * `vkgdr_pool_config.thread_cache`): still allocated in their chunks (counted in
   * `bytes_allocated`), given back by `vkgdr_pool_trim`. A caller whose `struct_size` ends
   * before this field does not get it.
   */
  uint64_t bytes_cached;
  /**
   * Blocks that thread caches keep for reuse (the blocks behind `bytes_cached`). A caller
   * whose `struct_size` ends before this field does not get it.
   */
  uint64_t blocks_cached;
  /**
   * How other threads reach the pool's thread caches (a `vkgdr_thread_cache_handshake`):
   * what each cached allocation and free costs its thread. A caller whose `struct_size` ends
   * before this field does not get it.
   */
  uint32_t thread_cache_handshake;
  /**
   * 1 once a lane of the pool's release feed broke (a kernel broke the ring's protocol): the
   * tokens it would carry never arrive, and their blocks stay lent. The fields from here on
   * count device-side releases (`vkgdr_block_release_on_device`); a caller whose
   * `struct_size` ends before a field does not get it.
   */
  uint32_t release_lane_broken;
  /**
   * Blocks lent to kernels now, not back in the pool yet (their tokens not arrived, or a drain
   * freeing them at this moment).
   */
  uint64_t lent_blocks;
  /**
   * Tokens issued (blocks released on the device).
   */
  uint64_t tokens_issued;
  /**
   * Tokens that came back and freed their blocks.
   */
  uint64_t tokens_redeemed;
  /**
   * Blocks taken back by `vkgdr_pool_reclaim_device_releases` before their tokens came.
   */
  uint64_t tokens_revoked;
  /**
   * Tokens refused, freeing nothing: forged, stale (of a block taken back, or an earlier
   * issue) or repeated.
   */
  uint64_t tokens_refused;
  /**
   * Records on the release lanes that are not release records, or whose length is not a
   * multiple of 8 (ignored).
   */
  uint64_t release_records_ignored;
} vkgdr_pool_stats;

/**
 * Opaque handle to the exclusive producer of one lane of a ring, from
 * `vkgdr_ring_producer_create`; freed with `vkgdr_ring_producer_destroy`.
 */
typedef struct vkgdr_ring_producer *vkgdr_ring_producer_t;

/**
 * Opaque handle to a ring, from `vkgdr_ring_create`; freed with `vkgdr_ring_destroy`.
 */
typedef struct vkgdr_ring *vkgdr_ring_t;

/**
 * How `vkgdr_ring_create_with_options` makes a ring. Fill it with `vkgdr_ring_options_init`,
 * then change what you need. Later versions may add fields at the end: `struct_size` tells the
 * library which ones the caller knows.
 */
typedef struct vkgdr_ring_options {
  /**
   * `sizeof(vkgdr_ring_options)` as the caller was compiled (set by
   * `vkgdr_ring_options_init`).
   */
  size_t struct_size;
  /**
   * Lanes, 1 to 64 (default 1): independent sub-rings of `capacity` bytes each, with their
   * own tail, head and sequence numbers. Give each producer thread its own lane
   * (`vkgdr_ring_producer_create`); a consumer reads each lane in order (one thread block
   * per lane, say). Records of different lanes are not ordered with each other.
   */
  uint32_t lanes;
  /**
   * 0, `VKGDR_RING_MIRRORED_BIT` (each lane then gets a region of its own mapped twice) or
   * `VKGDR_RING_SHAREABLE_BIT` (each lane an allocation of its own, to lend to other
   * processes with `vkgdr_share_ring`), and `VKGDR_RING_COPY_ENGINE_SPLIT_BIT` (with a
   * non-zero `copy_engine_record`, not with `VKGDR_RING_SHAREABLE_BIT`: three lanes in eight
   * keep records below 8 KiB on the BAR, the others take the copy engine from
   * `copy_engine_record` bytes on) or `VKGDR_RING_COPY_ENGINE_OFF_BIT` (every record through
   * the BAR).
   */
  uint32_t flags;
  /**
   * Records of at least this many bytes in the ring (16-byte header and padding to 16
   * included) that a `vkgdr_ring_producer_t` writes, once its batch has 64 KiB pending before
   * them (`vkgdr_ring_producer_set_stage_after` changes that for a producer), are staged in
   * pinned host memory and moved by a copy engine, which outruns CPU
   * stores through the BAR when several producers stream large records; smaller ones, lone
   * ones, and every record of `vkgdr_ring_push` and `vkgdr_ring_reserve`, take the BAR.
   * 0 (the default) lets the ring choose (`VKGDR_RING_COPY_ENGINE_OFF_BIT` says what it
   * chooses; with that flag the copy engine stays off); at most `UINT32_MAX`.
   * With `VKGDR_RING_COPY_ENGINE_SPLIT_BIT` in `flags` (which needs it non-zero) this holds
   * on five lanes in eight only; lanes 0, 3 and 6 of each eight stage records of at least
   * 8 KiB (or of `copy_engine_record`, if larger) and write smaller ones through the BAR.
   */
  uint64_t copy_engine_record;
} vkgdr_ring_options;

/**
 * Opaque handle to space reserved for one record, from `vkgdr_ring_reserve`; consumed by
 * `vkgdr_ring_commit` or `vkgdr_ring_cancel`.
 */
typedef struct vkgdr_ring_reservation *vkgdr_ring_reservation_t;

/**
 * What a consumer kernel needs (`vkgdr_ring_get_device_view`); the wire format is described in
 * `kernels/ring.cu`. Set `struct_size` to `sizeof(vkgdr_ring_device_view)` before the call.
 * Kernels that take `vkgdr_ring_view` of `include/vkgdr/ring.cuh` by value (`ring_check_lanes`)
 * get it from these fields: `data, capacity, tail, stop, head, result, lane_data, lanes`, and
 * `mirrored` as its `wrap`.
 */
typedef struct vkgdr_ring_device_view {
  /**
   * `sizeof(vkgdr_ring_device_view)` as the caller was compiled.
   */
  size_t struct_size;
  /**
   * Device address of the data region (16-byte aligned).
   */
  CUdeviceptr data;
  /**
   * Capacity of the data region in bytes (a power of two).
   */
  uint64_t capacity;
  /**
   * Device address of `tail` (u64 in GPU memory, written by the CPU: end of the published
   * records).
   */
  CUdeviceptr tail;
  /**
   * Device address of `stop` (u32 in GPU memory, set by `vkgdr_ring_stop`).
   */
  CUdeviceptr stop;
  /**
   * Device address of `head` (u64 in pinned host memory, written by the consumer: end of the
   * consumed records; producers reuse the space below it).
   */
  CUdeviceptr head;
  /**
   * Device address of 8 u64 result words in pinned host memory for the consumer to report
   * into (`vkgdr_ring_get_results` reads them).
   */
  CUdeviceptr result;
  /**
   * 1 for a ring made with `VKGDR_RING_MIRRORED_BIT`, else 0.
   */
  uint32_t mirrored;
  /**
   * Number of lanes (1 unless the ring was made with `vkgdr_ring_options.lanes`). `data`,
   * `tail`, `head` and `result` above are lane 0's; lane `i`'s `tail` is at
   * `tail + i * 128`, its `head` at `head + i * 256`, its result words at `result + i * 256`,
   * its data region at `((uint64_t *)lane_data)[i]` (device memory). A caller whose
   * `struct_size` ends before this field does not get it.
   */
  uint32_t lanes;
  /**
   * Device address of a table of `lanes` u64s: each lane's data region. A caller whose
   * `struct_size` ends before this field does not get it.
   */
  CUdeviceptr lane_data;
} vkgdr_ring_device_view;

/**
 * What the copy-engine path of a ring's lanes has done so far
 * (`vkgdr_ring_get_copy_engine_stats`). Set `struct_size` to
 * `sizeof(vkgdr_ring_copy_engine_stats)` before the call.
 */
typedef struct vkgdr_ring_copy_engine_stats {
  /**
   * `sizeof(vkgdr_ring_copy_engine_stats)` as the caller was compiled.
   */
  size_t struct_size;
  /**
   * Lanes whose staging copy and copy stream exist (made when a producer first claims the
   * lane, for rings whose copy engine is on).
   */
  uint32_t lanes_ready;
  /**
   * 1 when the copy-engine path could not be made (the lanes then use the BAR; the reason is
   * `vkgdr_ring_get_copy_engine_error`), else 0.
   */
  uint32_t unavailable;
  /**
   * Staged publications queued on the lanes' copy streams.
   */
  uint64_t copies;
  /**
   * Bytes those publications copied.
   */
  uint64_t bytes;
  /**
   * Publications whose copy could not be queued (a driver error): their staged bytes went
   * through the BAR instead.
   */
  uint64_t fallbacks;
  /**
   * Publications of records written through the BAR whose tail went through a lane's copy
   * stream, behind a staged publication's tail that had not landed yet.
   */
  uint64_t stream_tails;
} vkgdr_ring_copy_engine_stats;

/**
 * How `vkgdr_share_server_create` runs a server. Fill it with `vkgdr_share_options_init`, then
 * change what you need. Later versions may add fields at the end: `struct_size` tells the
 * library which ones the caller knows.
 */
typedef struct vkgdr_share_options {
  /**
   * `sizeof(vkgdr_share_options)` as the caller was compiled (set by
   * `vkgdr_share_options_init`).
   */
  size_t struct_size;
  /**
   * Who may attach, a `vkgdr_share_peers` (default `VKGDR_SHARE_PEERS_SAME_USER`).
   */
  uint32_t peers;
  /**
   * The socket file's permission bits, set before anyone is let in (default 0600).
   */
  uint32_t socket_mode;
  /**
   * With `VKGDR_SHARE_PEERS_UIDS`: the uids that may attach (`uid_count` of them, read
   * during `vkgdr_share_server_create` only). Ignored otherwise.
   */
  const uint32_t *uids;
  /**
   * Number of `uids`.
   */
  size_t uid_count;
  /**
   * How long the relay (which checks each remote producer's tail and passes it on to the
   * ring's consumer) keeps polling without a pause after a lane last moved (default
   * 2,000,000 ns).
   */
  uint64_t relay_spin_ns;
  /**
   * The relay's pause between polls once nothing moved for `relay_spin_ns` (default
   * 20,000 ns).
   */
  uint64_t relay_idle_poll_ns;
  /**
   * 1 (the default): a block a peer gives back waits for the owner
   * (`VKGDR_SHARE_EVENT_RELEASED`, then `vkgdr_share_take_returned`), with what the peer
   * wrote into it; 0: it goes straight back to its pool.
   */
  uint32_t return_blocks;
  /**
   * Must be 0.
   */
  uint32_t flags;
} vkgdr_share_options;

/**
 * Opaque handle to the owner's side of sharing, from `vkgdr_share_server_create`; freed with
 * `vkgdr_share_server_destroy`.
 */
typedef struct vkgdr_share_server *vkgdr_share_server_t;

/**
 * One event of a server (`vkgdr_share_next_event`). Set `struct_size` to
 * `sizeof(vkgdr_share_event)` before the call. Fields an event kind does not name are 0.
 */
typedef struct vkgdr_share_event {
  /**
   * `sizeof(vkgdr_share_event)` as the caller was compiled.
   */
  size_t struct_size;
  /**
   * A `vkgdr_share_event_kind`.
   */
  uint32_t kind;
  /**
   * The peer's process ID.
   */
  int32_t pid;
  /**
   * The peer's number, unique for the server's life (what `vkgdr_share_send_block` and
   * `vkgdr_share_revoke` take).
   */
  uint64_t peer;
  /**
   * A block's token.
   */
  uint64_t token;
  /**
   * The peer's effective uid.
   */
  uint32_t uid;
  /**
   * The attachment's number (the peer's end knows it too).
   */
  uint32_t attachment;
  /**
   * The lane of the ring.
   */
  uint32_t lane;
  /**
   * Bytes of the event's text, without the NUL: when it is `VKGDR_SHARE_EVENT_TEXT` or more,
   * `text` holds its first `VKGDR_SHARE_EVENT_TEXT - 1` bytes (cut at a UTF-8 character).
   */
  uint32_t text_len;
  /**
   * The event's text (a region name, a reason), UTF-8, NUL-terminated; empty for kinds
   * without one.
   */
  char text[VKGDR_SHARE_EVENT_TEXT];
} vkgdr_share_event;

/**
 * Counters over a server's life (`vkgdr_share_get_stats`). Set `struct_size` to
 * `sizeof(vkgdr_share_stats)` before the call.
 */
typedef struct vkgdr_share_stats {
  /**
   * `sizeof(vkgdr_share_stats)` as the caller was compiled.
   */
  size_t struct_size;
  /**
   * Peers let in.
   */
  uint64_t connected;
  /**
   * Processes turned away by the policy.
   */
  uint64_t refused;
  /**
   * Peers gone (hung up, died, revoked or disconnected).
   */
  uint64_t gone;
  /**
   * Peers disconnected for breaking the protocol.
   */
  uint64_t misbehaved;
  /**
   * Tails a remote producer published that the relay refused.
   */
  uint64_t lane_faults;
  /**
   * Peers connected now.
   */
  uint64_t peers;
} vkgdr_share_stats;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Copies `size` bytes from host memory `src` to `mapping_dst`, a pointer into a CPU mapping of
 * GPU memory (from `vkgdr_memory_get_host_ptr` or `vkgdr_block_get_host_ptr`, any offset), on
 * the calling thread: naturally aligned stores up to the vector width, then non-temporal vector
 * stores (AVX-512, AVX2 or SSE4.1, whichever the CPU has), then an `sfence`, so that a flag
 * written afterwards cannot overtake the data. Like gdrcopy's `gdr_copy_to_mapping`; no byte
 * outside the range is touched. No flush: on non-coherent memory call `vkgdr_memory_flush` or
 * `vkgdr_block_flush` afterwards.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if a pointer is NULL while `size` > 0.
 *
 * Thread safety: any thread; concurrent copies to disjoint ranges are fine.
 *
 * # Safety
 * - `mapping_dst` is writable and `src` readable for `size` bytes; the ranges do not overlap.
 * - No other thread accesses the destination range during the call.
 */
VKGDR_API int vkgdr_copy_to_mapping(void *mapping_dst, const void *src, size_t size);

/**
 * Copies `size` bytes from `mapping_src`, a pointer into a CPU mapping of GPU memory, to host
 * memory `dst`, on the calling thread: a full fence first (so the loads cannot pass an earlier
 * poll of a ready flag), then streaming loads (`movntdqa`) for the aligned bulk. Like gdrcopy's
 * `gdr_copy_from_mapping`; CPU reads through the BAR are slow (well under 1 GB/s per thread).
 * No invalidate: on non-coherent memory call `vkgdr_memory_invalidate` or
 * `vkgdr_block_invalidate` first.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if a pointer is NULL while `size` > 0.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `dst` is writable and `mapping_src` readable for `size` bytes; the ranges do not overlap.
 * - No other thread writes the source range through the CPU during the call.
 */
VKGDR_API int vkgdr_copy_from_mapping(void *dst, const void *mapping_src, size_t size);

/**
 * Creates a device → host ring on `g`'s device: `lanes` lanes (1 to 1024) of `slots` slots
 * (a power of two, 2 to 2^24) of `stride` bytes (a power of two, 32 to 65536: each record
 * carries up to `stride - 16` payload bytes). The slots are pinned host memory mapped for the
 * device; each lane's `head` and `closed` words are GPU memory the CPU stores to through the
 * BAR. A kernel's publication into a full lane gives up (`VKGDR_D2H_STALLED`) after
 * `spin_limit` looks at a head that does not move (each a read of GPU memory and a nap of up
 * to about 4 µs); the warp calls of `ring_d2h.cuh` reserve up to 32 slots at once, so give a
 * lane at least 32 slots.
 *
 * Returns a handle, or `NULL` on error (a bad shape or lane count, a `vkgdr_open_vulkan`
 * handle, a driver failure).
 *
 * Thread safety: any thread. Free it with `vkgdr_d2h_ring_destroy` once no kernel publishes
 * into it any more (synchronise with the producing kernels first: their stores go to the
 * ring's memory).
 *
 * # Safety
 * - No thread closes `g` during the call.
 */
VKGDR_API
vkgdr_d2h_ring_t vkgdr_d2h_ring_create(vkgdr_t g,
                                       uint32_t lanes,
                                       uint32_t slots,
                                       uint32_t stride,
                                       uint32_t spin_limit);

/**
 * `vkgdr_d2h_ring_create` with the slots' format: `VKGDR_D2H_FORMAT_COMMITTED` (the same
 * ring) or `VKGDR_D2H_FORMAT_TAGGED` (records of up to `stride / 2 - 8` bytes that reach the
 * CPU sooner: for status words, completion notices and release tokens). The kernels need no
 * change: `ring_d2h.cuh` reads the format from the view.
 *
 * Returns a handle, or `NULL` on error (an unknown format, and `vkgdr_d2h_ring_create`'s).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread closes `g` during the call.
 */
VKGDR_API
vkgdr_d2h_ring_t vkgdr_d2h_ring_create_with_format(vkgdr_t g,
                                                   uint32_t lanes,
                                                   uint32_t slots,
                                                   uint32_t stride,
                                                   uint32_t spin_limit,
                                                   uint32_t format);

/**
 * Destroys a ring: closes every open lane (a kernel still publishing gets `VKGDR_D2H_CLOSED`
 * from its next wait for room) and frees the memory. `NULL` is ignored.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already destroyed, or not a
 * `vkgdr_d2h_ring_t`.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No other thread uses `ring` during or after the call, and no kernel publishes into it any
 *   more (the memory goes back).
 */
VKGDR_API void vkgdr_d2h_ring_destroy(vkgdr_d2h_ring_t ring);

/**
 * Fills `*view` with what a producing kernel takes by value (`vkgdr_d2h_view` of
 * `ring_d2h.cuh`, the same 48 bytes).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `view` NULL).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `view` is NULL or writable for `sizeof(vkgdr_d2h_ring_device_view)` bytes.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API
int vkgdr_d2h_ring_get_device_view(vkgdr_d2h_ring_t ring,
                                   struct vkgdr_d2h_ring_device_view *view);

/**
 * Number of lanes of the ring, or 0 on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API uint32_t vkgdr_d2h_ring_get_lanes(vkgdr_d2h_ring_t ring);

/**
 * The largest payload a record of the ring carries (`stride - 16`): the least `capacity` of
 * the buffers `vkgdr_d2h_ring_try_next` and `vkgdr_d2h_ring_next` take. 0 on error (an
 * invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API uint32_t vkgdr_d2h_ring_get_max_payload(vkgdr_d2h_ring_t ring);

/**
 * Takes the next record of lane `lane` if it has arrived, without waiting: copies its payload
 * into `buf` and its number, kind and length into `*rec`; its slot goes back to the device at
 * the lane's next call (or its close, or `vkgdr_d2h_ring_publish_head`), so the store that
 * hands it back is not on the record's way to the caller. Records of a lane come in the order the device reserved them; the lane's
 * first call opens it (from where an earlier consumer stopped).
 *
 * - `capacity`: bytes of `buf`, at least `vkgdr_d2h_ring_get_max_payload(ring)`.
 * - `rec`: its `struct_size` set by the caller.
 *
 * Returns `VKGDR_SUCCESS` (a record), `VKGDR_D2H_RING_EMPTY` (none has arrived; nothing
 * taken), `VKGDR_D2H_RING_ENDED` (none will come: `vkgdr_d2h_ring_finish` was called and the
 * lane is empty), or `VKGDR_ERROR`: an invalid handle, no such lane, the lane closed or in use by
 * another thread, `buf` too small or NULL, `rec` NULL or its `struct_size` unset, or the
 * device broke the protocol ("slot of record N holds commit word ...": the lane is broken and
 * every later call says so).
 *
 * Thread safety: any thread, one at a time per lane (a call on a lane another thread is inside
 * fails); lanes are independent.
 *
 * # Safety
 * - `buf` is writable for `capacity` bytes; `rec` is NULL or writable for `rec->struct_size`
 *   bytes.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API
int vkgdr_d2h_ring_try_next(vkgdr_d2h_ring_t ring,
                            uint32_t lane,
                            void *buf,
                            size_t capacity,
                            struct vkgdr_d2h_record *rec);

/**
 * `vkgdr_d2h_ring_try_next` that waits up to `timeout_ns` nanoseconds for the record to arrive
 * (negative: without limit; 0: one look), spinning first (a record that comes within
 * microseconds is seen at once), then yielding, then napping up to 50 µs between looks.
 *
 * Returns `VKGDR_SUCCESS`, `VKGDR_D2H_RING_EMPTY` (nothing arrived in time),
 * `VKGDR_D2H_RING_ENDED` (none will come) or `VKGDR_ERROR`, as `vkgdr_d2h_ring_try_next`. A
 * wait without limit ends from another thread with `vkgdr_d2h_ring_finish`: the call then
 * returns `VKGDR_D2H_RING_ENDED` once the lane is empty (the lane itself cannot be closed while
 * this thread is inside it).
 *
 * Thread safety: as `vkgdr_d2h_ring_try_next`.
 *
 * # Safety
 * - As `vkgdr_d2h_ring_try_next`.
 */
VKGDR_API
int vkgdr_d2h_ring_next(vkgdr_d2h_ring_t ring,
                        uint32_t lane,
                        int64_t timeout_ns,
                        void *buf,
                        size_t capacity,
                        struct vkgdr_d2h_record *rec);

/**
 * Hands the slots of every record taken from lane `lane` back to the device now. A take
 * (`vkgdr_d2h_ring_try_next`, `vkgdr_d2h_ring_next`) leaves the lane's head one record behind
 * and moves it at the lane's next call or close, so that its store through the BAR is not on
 * the record's way to the caller; a caller that holds on to a record a while calls this first
 * (until then the lane looks one record fuller to its kernels: enough to keep out a warp's
 * 32-record reservation). A lane that is not open has nothing to hand back.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such lane, the lane in use
 * by another thread).
 *
 * Thread safety: any thread, one at a time per lane.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API int vkgdr_d2h_ring_publish_head(vkgdr_d2h_ring_t ring, uint32_t lane);

/**
 * Closes lane `lane`: tells the device that nothing will be taken from it any more (its
 * waiting and later publications end with `VKGDR_D2H_CLOSED`). Records committed before stay;
 * a later take from the lane opens it again, where this consumer stopped. Closing a lane that
 * is not open does nothing.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such lane, the lane in use
 * by another thread).
 *
 * Thread safety: any thread, one at a time per lane.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API int vkgdr_d2h_ring_close_lane(vkgdr_d2h_ring_t ring, uint32_t lane);

/**
 * Closes every lane: kernels waiting for room, and later publications, give up with
 * `VKGDR_D2H_CLOSED`. Records committed before stay; a lane's next take opens it again.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread, also while consumers take.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API int vkgdr_d2h_ring_close(vkgdr_d2h_ring_t ring);

/**
 * Declares the producing kernels finished: the caller knows they completed (it synchronised
 * their stream or context), so everything they committed is visible. From then on a lane whose
 * records were all taken reports `VKGDR_D2H_RING_ENDED` instead of waiting. Call
 * `vkgdr_d2h_ring_restart` before the next launch publishes into the ring.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API int vkgdr_d2h_ring_finish(vkgdr_d2h_ring_t ring);

/**
 * Clears `vkgdr_d2h_ring_finish` before a new launch publishes into the ring: its lanes wait
 * for records again.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API int vkgdr_d2h_ring_restart(vkgdr_d2h_ring_t ring);

/**
 * Fills `*stats` (whose `struct_size` the caller sets) with lane `lane`'s counters: records
 * reserved by the kernels, taken by the consumers, and publications that gave up. Read through
 * the BAR: a few microseconds, not for a hot loop.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such lane, `stats` NULL or
 * its `struct_size` unset).
 *
 * Thread safety: any thread, also while the lane's consumer takes.
 *
 * # Safety
 * - `stats` is NULL or writable for `stats->struct_size` bytes.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API
int vkgdr_d2h_ring_get_lane_stats(vkgdr_d2h_ring_t ring,
                                  uint32_t lane,
                                  struct vkgdr_d2h_lane_stats *stats);

/**
 * Obtains a handle to the library.
 *
 * - `device`: the CUDA device whose memory to allocate (ignored if `flags` contains
 *   `VKGDR_OPEN_CURRENT_CONTEXT_BIT`). No CUDA context is created: raw allocations go into the
 *   context current when they are made; pools and rings of this handle use the device's primary
 *   context (retained the first time one needs it).
 * - `flags`: a bitwise OR of `vkgdr_open_flags`. With `VKGDR_OPEN_CURRENT_CONTEXT_BIT` the
 *   calling thread's current context is used, whatever kind it is (the runtime's primary
 *   context, or one from `cuCtxCreate`); pools and rings of the handle then live in that
 *   context, which must outlive the handle and everything allocated through it. Other bits
 *   are ignored, as vkgdr 0.1 ignores them.
 *
 * Clears the calling thread's last error first (as vkgdr 0.1 does), so after this call
 * `vkgdr_last_error()` is `NULL` exactly when it succeeded.
 *
 * Returns a handle, or `NULL` on error (`vkgdr_last_error()` says why: e.g.
 * `cuDeviceGetUuid failed (CUDA_ERROR_INVALID_DEVICE)` for an invalid device,
 * `cuCtxGetDevice failed (CUDA_ERROR_INVALID_CONTEXT)` with no current context, the missing
 * `libcuda.so.1` or `libvulkan.so.1`).
 *
 * Thread safety: any thread. The handle may be used from many threads at once.
 * Free it with `vkgdr_close`.
 *
 * # Safety
 * - With `VKGDR_OPEN_CURRENT_CONTEXT_BIT` and a context from `cuCtxCreate`: that context must
 *   stay alive until the handle and everything allocated through it are freed.
 */
VKGDR_API vkgdr_t vkgdr_open(CUdevice device, uint32_t flags);

/**
 * Opens the Vulkan half only, on a machine with or without CUDA: `vkgdr_pool_create` works on
 * such a handle (its blocks have host pointers and device pointer 0); `vkgdr_memory_alloc` and
 * `vkgdr_ring_create` fail, as they need CUDA. For tests (Mesa's lavapipe) and programs that
 * only need Vulkan's exportable host-visible memory.
 *
 * - `vulkan_device`: index in Vulkan's physical-device order, or -1 for the first device with
 *   exportable host-visible device-local memory.
 * - `flags`: `VKGDR_OPEN_FORCE_NON_COHERENT_BIT` and/or `VKGDR_OPEN_REQUIRE_COHERENT_BIT`;
 *   `VKGDR_OPEN_CURRENT_CONTEXT_BIT` is an error (it needs CUDA), other bits are ignored as
 *   `vkgdr_open` ignores them.
 *
 * Clears the calling thread's last error first, like `vkgdr_open`.
 *
 * Returns a handle, or `NULL` on error (see `vkgdr_last_error()`).
 *
 * Thread safety: any thread; the handle may be used from many threads. Free it with
 * `vkgdr_close`.
 *
 * # Safety
 * - None beyond the C calling convention.
 */
VKGDR_API vkgdr_t vkgdr_open_vulkan(int vulkan_device, uint32_t flags);

/**
 * Closes a handle from `vkgdr_open` or `vkgdr_open_vulkan`. `NULL` is ignored.
 *
 * Unlike vkgdr 0.1 this may be called while allocations, pools or rings made through the handle
 * are still alive: they keep the device open until they are freed themselves.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already closed or not a
 * `vkgdr_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same handle.
 *
 * # Safety
 * - No other thread uses `g` during or after the call.
 */
VKGDR_API void vkgdr_close(vkgdr_t g);

/**
 * Releases of memory allocated through `g` (raw memory, pool chunks and blocks, rings) that
 * still wait for GPU work queued before them: frees never wait for a running kernel, they fence
 * on a stream (the legacy default stream, or the one named to `vkgdr_memory_free_after`,
 * `vkgdr_block_free_after` or `vkgdr_ring_watch_consumer`), and the memory stays in use until
 * the GPU has passed that point. This waits up to `timeout_ns` for that count to reach 0, for
 * tests and orderly shutdown; nothing else needs it. `vkgdr_get_release_times` says which
 * release has waited longest, and for how long.
 *
 * - `timeout_ns`: 0 only counts (after handing back what is due), negative waits until none is
 *   left (for ever, while a kernel holds a stream back).
 *
 * Returns the number still waiting (0 once everything is released); 0 also for a
 * `vkgdr_open_vulkan` handle, which has no GPU work to wait for. `SIZE_MAX` on error (an
 * invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread closes `g` during the call.
 */
VKGDR_API size_t vkgdr_wait_for_releases(vkgdr_t g, int64_t timeout_ns);

/**
 * Fills `*times` (whose `struct_size` the caller sets) with how the releases of memory
 * allocated through `g` went: how many wait now (as `vkgdr_wait_for_releases` counts them), the
 * one that has waited longest of those, and the slowest so far (see `vkgdr_release_times`).
 * For finding what holds memory back, e.g. a kernel that never ends on the stream a free
 * waits for. Takes a lock of the release queue briefly; waits for nothing.
 *
 * Returns `VKGDR_SUCCESS` (for a `vkgdr_open_vulkan` handle with every field but
 * `struct_size` 0: its releases wait for no GPU work), or `VKGDR_ERROR` (`times` NULL or its
 * `struct_size` unset, checked first; an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `times` is NULL or writable for `times->struct_size` bytes.
 * - No thread closes `g` during the call.
 */
VKGDR_API int vkgdr_get_release_times(vkgdr_t g, struct vkgdr_release_times *times);

/**
 * Gives back to the driver what `g` keeps for later allocations: the empty shared granule small
 * allocations (up to 1 MiB) are carved from, and the mappings of larger freed allocations kept
 * for the next allocation of the same size, which then takes no driver call (each up to 1/1024
 * of the device's BAR heap, 32–256 MiB: 64 MiB on an H100, 128 MiB on an H200; two of those in
 * all). Memory whose release still waits for GPU work is not reached: call
 * `vkgdr_wait_for_releases` first to count free VRAM exactly.
 *
 * - `released`: NULL, or where to store the number of granules and mappings released.
 *
 * Returns `VKGDR_SUCCESS` (also for a `vkgdr_open_vulkan` handle, which keeps nothing), or
 * `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread, concurrently with allocations.
 *
 * # Safety
 * - `released` is NULL or writable.
 * - No thread closes `g` during the call.
 */
VKGDR_API int vkgdr_trim(vkgdr_t g, size_t *released);

/**
 * How much `g` keeps of the mappings freed allocations leave for the next allocation of their
 * size (see `vkgdr_trim`): the largest freed allocation whose mapping is kept (bytes, the size
 * asked for rounded up to 4 KiB), and the bytes kept in all. By default 1/1024 of the device's
 * BAR heap, rounded down to a power of two, between 32 and 256 MiB (64 MiB on an H100, 128 MiB
 * on an H200), and twice that in all.
 *
 * - `each`, `total`: NULL, or where to store the limits; 0 and 0 for a `vkgdr_open_vulkan`
 *   handle, which keeps nothing.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle); nothing is written on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `each` and `total` are NULL or writable.
 * - No thread closes `g` during the call.
 */
VKGDR_API int vkgdr_get_spare_limits(vkgdr_t g, uint64_t *each, uint64_t *total);

/**
 * Keeps the mappings freed allocations of `g` leave within new limits from now on: a freed
 * allocation of up to `each` bytes (rounded up to 4 KiB) keeps its mapping for the next
 * allocation of its size, `total` bytes in all. Those kept beyond the new limits (larger than
 * `each`, then the oldest until the total fits) go back to the driver during the call. 0 for
 * either keeps none: every free gives its memory back, as in vkgdr 0.1.
 *
 * - `released`: NULL, or where to store how many kept mappings went back.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, or one of `vkgdr_open_vulkan`,
 * which keeps nothing).
 *
 * Thread safety: any thread, concurrently with allocations.
 *
 * # Safety
 * - `released` is NULL or writable.
 * - No thread closes `g` during the call.
 */
VKGDR_API int vkgdr_set_spare_limits(vkgdr_t g, uint64_t each, uint64_t total, size_t *released);

/**
 * Gives `ring`'s lanes to `pool` as its release feed: the records of `vkgdr_release_token`
 * that kernels publish into them bring released blocks back. Once per pool; the pool then
 * drains the lanes itself (on a thread of its own, on allocations and on
 * `vkgdr_pool_drain_device_releases`), so they are not the C caller's to take from any more
 * (`vkgdr_d2h_ring_try_next` on them fails: the lane has a consumer). The pool keeps the
 * ring's memory alive as long as blocks are lent, also after `vkgdr_d2h_ring_destroy`.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`: an invalid handle, a lane of the ring with a
 * consumer (close it first), a pool that has a feed already.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `pool` or `ring` during the call.
 */
VKGDR_API int vkgdr_pool_set_release_feed(vkgdr_pool_t pool, vkgdr_d2h_ring_t ring);

/**
 * Lends `block` to a kernel: stores in `*token` the value the kernel passes to
 * `vkgdr_release_token` (`include/vkgdr/ring_d2h.cuh`) when it is done with the block. The
 * block goes back to its pool only when that token has come back through the pool's release
 * feed (`vkgdr_pool_set_release_feed`), so it is never handed out again while the kernel may
 * still use it. A token is single-use: a repeated, stale or forged one frees nothing.
 *
 * Consumes the handle, also on error: a block that could not be lent (the pool has no release
 * feed, or has the most blocks lent it can hold) is freed at once.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`: an invalid handle (nothing consumed), `token`
 * NULL (nothing consumed), the refusals above.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `token` is NULL or writable.
 * - No other thread uses `block` during or after the call.
 */
VKGDR_API int vkgdr_block_release_on_device(vkgdr_block_t block, uint64_t *token);

/**
 * `vkgdr_block_release_on_device` for `count` blocks of `pool` at once, the pool's token table
 * locked once: lends `blocks[0..count)` in order and stores in `tokens[i]` the token of
 * `blocks[i]`. `*lent` gets how many were lent (always written once the pointers are checked):
 * `blocks[0..*lent)` are consumed (set to NULL) and `tokens[0..*lent)` written. A batch
 * refused part-way (the pool has no release feed, has the most blocks lent it can hold, or
 * `blocks[*lent]` is another pool's) returns `VKGDR_ERROR` with `*lent` lent; the blocks from
 * `blocks[*lent]` on are not lent and stay the caller's, each under a new handle written back
 * into `blocks` (the old ones are invalid; NULL only if the handle table is full).
 *
 * Returns `VKGDR_SUCCESS` (every block lent; `count` 0 included), or `VKGDR_ERROR`: an invalid
 * pool handle, `lent` NULL, `blocks` or `tokens` NULL with `count` > 0, an invalid block
 * handle or one given twice (nothing consumed, `*lent` 0), the refusals above.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `blocks` holds `count` handles and is writable; `tokens` has room for `count` values;
 *   `lent` is NULL or writable.
 * - No other thread uses any of the blocks during or after the call, nor destroys `pool`
 *   during it.
 */
VKGDR_API
int vkgdr_pool_release_many_on_device(vkgdr_pool_t pool,
                                      vkgdr_block_t *blocks,
                                      size_t count,
                                      uint64_t *tokens,
                                      size_t *lent);

/**
 * Takes every device release that has arrived on the pool's release feed and frees the blocks
 * given back (the pool's own thread and its allocations do it too). On return every block whose
 * token arrived before the call is back in the pool, those another thread's drain took included.
 * Returns the number of blocks this call freed, or `SIZE_MAX` on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `pool` during the call.
 */
VKGDR_API size_t vkgdr_pool_drain_device_releases(vkgdr_pool_t pool);

/**
 * Blocks of `pool` lent to kernels now (released on the device and not back in the pool yet:
 * their tokens not arrived, or a drain freeing them at this moment), or `UINT64_MAX` on error
 * (an invalid handle). Once it reads 0, every block lent before is allocatable again.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `pool` during the call.
 */
VKGDR_API uint64_t vkgdr_pool_get_lent_blocks(vkgdr_pool_t pool);

/**
 * Frees every block of `pool` lent to kernels without waiting for its token (their tokens are
 * stale from then on: they free nothing). For a host that knows its kernels are done (they
 * exited and their stream was synchronised), or that a kernel will never release (it failed).
 * Returns how many blocks were freed, or `SIZE_MAX` on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No kernel reads or writes any lent block of the pool whose token has not arrived: the
 *   blocks are handed out again at once.
 * - No thread destroys `pool` during the call.
 */
VKGDR_API size_t vkgdr_pool_reclaim_device_releases(vkgdr_pool_t pool);

/**
 * The calling thread's last error: a copy the caller must release with `free()`, or `NULL` if
 * no call has failed since the thread's last `vkgdr_open`, `vkgdr_open_vulkan` or
 * `vkgdr_memory_alloc` began (they clear it first, as vkgdr 0.1's `vkgdr_open` and
 * `vkgdr_memory_alloc` do), or since the thread started. Reading it does not clear it.
 *
 * Every other function of the library sets it when it fails and leaves it alone when it
 * succeeds (as in vkgdr 0.1): look at a function's return value first, then read the error.
 * Messages of driver failures read `"<call> failed (<RESULT_NAME>)"`, e.g.
 * `"cuDeviceGetUuid failed (CUDA_ERROR_INVALID_DEVICE)"`. Returns `NULL` also if the copy
 * cannot be allocated.
 *
 * Thread safety: any thread; each thread has its own last error.
 */
VKGDR_API char *vkgdr_last_error(void);

/**
 * Allocates `size` bytes of GPU memory with a host mapping, imported into the calling thread's
 * **current** CUDA context (which must belong to the handle's device); kernels of that context
 * use `vkgdr_memory_get_device_ptr`. Costs a Vulkan allocation and a CUDA import (hundreds of
 * microseconds): for many small buffers use a pool (`vkgdr_pool_create`).
 *
 * The contents are unspecified, except that the first 16 bytes are zero: they are written when
 * the memory is made, which warms the write path so that the first write is as fast as later ones.
 *
 * - `flags`: for future expansion; pass 0 (other values are ignored, as vkgdr 0.1 ignores them).
 *
 * Clears the calling thread's last error first (as vkgdr 0.1 does), so after this call
 * `vkgdr_last_error()` is `NULL` exactly when it succeeded.
 *
 * Returns a handle, or `NULL` on error (`vkgdr_last_error()`: e.g.
 * `vkAllocateMemory failed (VK_ERROR_OUT_OF_DEVICE_MEMORY)` when the BAR-mappable memory is
 * exhausted; with no current context, how to make one current (or to use a pool), ending
 * `cuCtxGetDevice failed (CUDA_ERROR_INVALID_CONTEXT)`).
 *
 * Thread safety: any thread, concurrently with other calls on the same `g`.
 * Free the memory with `vkgdr_memory_free`.
 *
 * # Safety
 * - The current context stays alive until the memory is freed.
 * - No thread closes `g` during the call.
 */
VKGDR_API vkgdr_memory_t vkgdr_memory_alloc(vkgdr_t g, size_t size, uint32_t flags);

/**
 * Allocates `size` bytes of memory of its own, for sharing with other processes
 * (`vkgdr_share_memory`): never carved out of a larger allocation that other memory shares,
 * so the fd a peer receives reaches these bytes and no others. `vkgdr_memory_alloc`'s small
 * allocations are carved, and cannot be shared.
 *
 * - `g`: a `vkgdr_open` handle: GPU memory like `vkgdr_memory_alloc`'s, but imported into the
 *   handle's context (the one current at `vkgdr_open` with `VKGDR_OPEN_CURRENT_CONTEXT_BIT`,
 *   else the device's primary context) and rounded up to the VMM granularity (2 MiB on the
 *   H100). Or a `vkgdr_open_vulkan` handle: Vulkan memory with a host pointer alone
 *   (`vkgdr_memory_get_device_ptr` is 0), for an owner without CUDA; every memory call takes
 *   it, and the frees release it at once.
 * - `flags`: must be 0.
 *
 * The contents are unspecified. `vkgdr_memory_get_size` reports `size`.
 *
 * Returns a handle, or `NULL` on error (a zero size, unknown flags, an invalid handle, the
 * driver's out-of-memory `vkAllocateMemory failed (VK_ERROR_OUT_OF_DEVICE_MEMORY)`).
 *
 * Thread safety: any thread. Free the memory with `vkgdr_memory_free`.
 *
 * # Safety
 * - No thread closes `g` during the call.
 */
VKGDR_API vkgdr_memory_t vkgdr_memory_alloc_shareable(vkgdr_t g, size_t size, uint32_t flags);

/**
 * Frees memory from `vkgdr_memory_alloc` or `vkgdr_memory_alloc_shareable`. `NULL` is ignored.
 * Unlike vkgdr 0.1 any thread may call it with any (or no) context current: the memory makes its
 * own context current to free itself.
 *
 * Never waits for a running kernel: it returns at once, and the memory goes back to the driver
 * once the GPU work queued before this call on the legacy default stream of the memory's
 * context has completed (and so the work of every blocking stream, such as the runtime's
 * default stream). Until then it counts as in use (`vkgdr_wait_for_releases`). So freeing memory
 * right after launching a kernel on it on such a stream is safe. Kernels on streams created
 * non-blocking are not waited for: free what they may still use with `vkgdr_memory_free_after`.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already freed or not a
 * `vkgdr_memory_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same handle.
 *
 * # Safety
 * - No other thread uses `mem` during or after the call, and no kernel on a non-blocking
 *   stream uses the memory any more.
 */
VKGDR_API void vkgdr_memory_free(vkgdr_memory_t mem);

/**
 * Frees memory from `vkgdr_memory_alloc` (or `vkgdr_memory_alloc_shareable`) once the GPU work
 * queued on `stream` so far has completed, without waiting for it: for memory a kernel on a stream
 * created non-blocking (`CU_STREAM_NON_BLOCKING`, such as a persistent kernel's) may still use,
 * which `vkgdr_memory_free` does not wait for. Returns at once; the memory counts as in use
 * (`vkgdr_wait_for_releases`) until the stream gets there.
 *
 * - `mem`: `NULL` is ignored (`VKGDR_SUCCESS`).
 * - `stream`: a live stream of the memory's device (a `CUstream`, or the runtime's
 *   `cudaStream_t`). `NULL` and `CU_STREAM_LEGACY` mean the legacy default stream: this is then
 *   `vkgdr_memory_free`. `CU_STREAM_PER_THREAD` needs the memory's context current. Ignored for
 *   memory of a `vkgdr_open_vulkan` handle, which no GPU work uses: it is released at once.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`: for a handle already freed or not a
 * `vkgdr_memory_t` (nothing happens), or for a stream the driver refuses (e.g.
 * `cuStreamGetCtx failed (CUDA_ERROR_INVALID_HANDLE)`), in which case the memory is freed as
 * `vkgdr_memory_free` frees it. Except for an invalid handle, `mem` is gone after the call.
 *
 * Thread safety: any thread, but not while another thread is using the same handle.
 *
 * # Safety
 * - No other thread uses `mem` during or after the call.
 * - `stream` is NULL, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a stream not yet
 *   destroyed; where the driver lacks stream memory operations (then an event fences the
 *   release), its context stays alive until the release has happened.
 */
VKGDR_API int vkgdr_memory_free_after(vkgdr_memory_t mem, CUstream stream);

/**
 * Frees memory from `vkgdr_memory_alloc` now, without waiting for any GPU work queued before:
 * for memory that no kernel or copy in flight uses, which the driver then has back at once
 * (`vkgdr_memory_free` waits, in the background, for the legacy default stream first). `NULL`
 * is ignored. Never waits either.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already freed or not a
 * `vkgdr_memory_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same handle.
 *
 * # Safety
 * - No other thread uses `mem` during or after the call, and no GPU work in flight uses the
 *   memory.
 */
VKGDR_API void vkgdr_memory_free_now(vkgdr_memory_t mem);

/**
 * The host pointer to the allocation, or `NULL` on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread frees `mem` during the call.
 */
VKGDR_API void *vkgdr_memory_get_host_ptr(vkgdr_memory_t mem);

/**
 * The CUDA device pointer to the allocation (valid in the context that was current at
 * `vkgdr_memory_alloc`), or 0: on error (an invalid handle; `vkgdr_last_error()` is set) and
 * for `vkgdr_memory_alloc_shareable` memory of a `vkgdr_open_vulkan` handle (no error).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread frees `mem` during the call.
 */
VKGDR_API CUdeviceptr vkgdr_memory_get_device_ptr(vkgdr_memory_t mem);

/**
 * The size of the allocation as asked for (a 4097-byte request reports 4097), or 0 on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread frees `mem` during the call.
 */
VKGDR_API size_t vkgdr_memory_get_size(vkgdr_memory_t mem);

/**
 * Whether the allocation is coherent from the host's point of view (flushes and invalidates are
 * then no-ops). `false` also on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread frees `mem` during the call.
 */
VKGDR_API bool vkgdr_memory_is_coherent(vkgdr_memory_t mem);

/**
 * The alignment of flush and invalidate ranges: `nonCoherentAtomSize`, or 1 when the memory is
 * coherent. 0 on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread frees `mem` during the call.
 */
VKGDR_API size_t vkgdr_memory_non_coherent_atom_size(vkgdr_memory_t mem);

/**
 * Flushes host writes in `[offset, offset + size)` so the device sees them (kernels launched
 * after this call). `size` `SIZE_MAX` flushes from `offset` to the end of the allocation (as
 * `VK_WHOLE_SIZE` does in vkgdr 0.1). The range is widened to whole atoms inside the allocation,
 * so unaligned ranges are fine (vkgdr 0.1 left them undefined). A no-op on coherent memory.
 *
 * Errors (reported through `vkgdr_last_error()` only; success leaves it as it was): an invalid
 * handle, a range outside the allocation, or the driver's failure
 * (`vkFlushMappedMemoryRanges failed (...)`).
 *
 * Thread safety: any thread, also concurrently on the same handle.
 *
 * # Safety
 * - No thread frees `mem` during the call.
 */
VKGDR_API void vkgdr_memory_flush(vkgdr_memory_t mem, size_t offset, size_t size);

/**
 * Invalidates the host's view of `[offset, offset + size)` so that device writes (of kernels
 * that have completed) are visible to the host. `size` `SIZE_MAX` means to the end of the
 * allocation, and the range is widened to whole atoms, as for `vkgdr_memory_flush`; a no-op on
 * coherent memory.
 *
 * Errors: as `vkgdr_memory_flush` (`vkInvalidateMappedMemoryRanges failed (...)`).
 *
 * Thread safety: any thread, also concurrently on the same handle.
 *
 * # Safety
 * - No thread frees `mem` during the call.
 */
VKGDR_API void vkgdr_memory_invalidate(vkgdr_memory_t mem, size_t offset, size_t size);

/**
 * Copies `size` bytes from `src` to `offset` of the allocation with the fast write-combining
 * copy (on the calling thread; from 1 MiB spread over worker threads), then flushes them: the
 * device sees them once this returns.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the allocation's
 * requested size, `src` NULL with `size` > 0, or a flush failure).
 *
 * Thread safety: any thread; concurrent writes to disjoint ranges are fine.
 *
 * # Safety
 * - `src` is readable for `size` bytes and does not overlap the destination range.
 * - No other thread accesses the destination range during the call, or frees `mem`.
 */
VKGDR_API int vkgdr_memory_write(vkgdr_memory_t mem, size_t offset, const void *src, size_t size);

/**
 * Copies `size` bytes of the allocation at `offset` into `dst`, as the library reads any
 * mapping: reads below 16 KiB invalidate, then copy with streaming loads (CPU reads through
 * the BAR are far slower than writes); larger ones use the GPU's copy engine (on a stream of the
 * library's own, in the handle's context: the device's primary context unless the handle was
 * opened with `VKGDR_OPEN_CURRENT_CONTEXT_BIT`), from 1 MiB through pinned staging buffers.
 * Memory of a `vkgdr_open_vulkan` handle is read with CPU loads, whatever the size.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the allocation's
 * requested size, `dst` NULL with `size` > 0, or a driver failure).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `dst` is writable for `size` bytes and does not overlap the source range.
 * - No thread frees `mem` during the call.
 */
VKGDR_API int vkgdr_memory_read(vkgdr_memory_t mem, size_t offset, void *dst, size_t size);

/**
 * Connects to the owner listening at `path` (its `vkgdr_share_server_create`). Nothing is
 * mapped yet: the Vulkan device is opened when the first region arrives, by the UUID of the
 * GPU the owner names (no CUDA in this process: it runs without libcuda, with any driver that
 * has Vulkan's external-memory fds).
 *
 * - `timeout_ns`: how long each call that waits for the owner's answer waits (attach,
 *   request); 0 for the default, 10 s.
 * - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (a NULL pointer; no server at `path`, e.g.
 * `connect failed (ENOENT)`, or one that refuses this process's uid, the path named).
 *
 * Thread safety: any thread; the connection may be used from many threads. Free it with
 * `vkgdr_peer_destroy`; what was attached through it keeps it alive until detached.
 *
 * # Safety
 * - `path` is a NUL-terminated string; `out` is writable.
 */
VKGDR_API int vkgdr_peer_connect(const char *path, uint64_t timeout_ns, vkgdr_peer_t *out);

/**
 * Closes this handle of the connection. `NULL` is ignored. Regions attached through it stay
 * attached (and the connection open) until they are detached; then the owner sees the peer
 * go.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
 * `vkgdr_peer_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same handle.
 *
 * # Safety
 * - No other thread uses `peer` during or after the call.
 */
VKGDR_API void vkgdr_peer_destroy(vkgdr_peer_t peer);

/**
 * Reads everything the owner sent meanwhile, without waiting: revocations (after which
 * `vkgdr_attached_memory_is_revoked` and the others say so, and writes are refused) and
 * blocks sent unasked. Every call that waits for the owner does this too.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle; an owner that sent something
 * the protocol does not allow; an owner that hung up, from the first call that finds nothing
 * it sent before the hang-up: `the other side of the share connection hung up`).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `peer` during the call.
 */
VKGDR_API int vkgdr_peer_poll(vkgdr_peer_t peer);

/**
 * Attaches the raw memory the owner shares as `name` (`vkgdr_share_memory`) and maps all of
 * it.
 *
 * - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a NULL pointer; the owner's
 * refusal, e.g. `the owner refused: no such region: nothing is shared as "params"`; a region
 * that is no raw memory; a region of a GPU or driver this process's Vulkan cannot import; an
 * owner that hung up or did not answer in time).
 *
 * Thread safety: any thread. Detach it with `vkgdr_attached_memory_detach`.
 *
 * # Safety
 * - `name` is a NUL-terminated string; `out` is writable.
 * - No thread destroys `peer` during the call.
 */
VKGDR_API
int vkgdr_peer_attach_memory(vkgdr_peer_t peer,
                             const char *name,
                             vkgdr_attached_memory_t *out);

/**
 * The host address of the attached memory (all `vkgdr_attached_memory_get_size` bytes are
 * mapped), or `NULL` on error (an invalid handle). Stores through it are not checked for
 * revocation: `vkgdr_attached_memory_write` is; on non-coherent memory
 * `vkgdr_attached_memory_flush` makes them visible to the GPU.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `mem` during the call.
 */
VKGDR_API void *vkgdr_attached_memory_get_host_ptr(vkgdr_attached_memory_t mem);

/**
 * The size of the attached memory, as the owner shared it, or 0 on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `mem` during the call.
 */
VKGDR_API size_t vkgdr_attached_memory_get_size(vkgdr_attached_memory_t mem);

/**
 * Whether the attached memory is coherent for this process (flushes and invalidates are then
 * no-ops): as the owner's is. `false` also on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `mem` during the call.
 */
VKGDR_API bool vkgdr_attached_memory_is_coherent(vkgdr_attached_memory_t mem);

/**
 * Makes stores through the host pointer to `[offset, offset + size)` visible to the GPU
 * (`SIZE_MAX`: to the end), widened to whole atoms. A no-op on coherent memory, apart from the
 * range check.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the memory,
 * `vkFlushMappedMemoryRanges failed (...)`).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `mem` during the call.
 */
VKGDR_API int vkgdr_attached_memory_flush(vkgdr_attached_memory_t mem, size_t offset, size_t size);

/**
 * Makes the GPU's writes to `[offset, offset + size)` visible to loads through the host
 * pointer (`SIZE_MAX`: to the end), widened to whole atoms. A no-op on coherent memory, apart
 * from the range check.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the memory,
 * `vkInvalidateMappedMemoryRanges failed (...)`).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `mem` during the call.
 */
VKGDR_API
int vkgdr_attached_memory_invalidate(vkgdr_attached_memory_t mem,
                                     size_t offset,
                                     size_t size);

/**
 * Copies `size` bytes from `src` to `offset` of the attached memory (the fast write-combining
 * copy), then flushes them: the owner's GPU sees them once this returns.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle; memory the owner revoked,
 * `revoked by the owner`, nothing written; a range outside the memory; `src` NULL with
 * `size` > 0; a flush failure).
 *
 * Thread safety: any thread; concurrent writes to disjoint ranges are fine.
 *
 * # Safety
 * - `src` is readable for `size` bytes and does not overlap the destination range.
 * - No other thread of this process accesses the destination range during the call, or
 *   detaches `mem`.
 */
VKGDR_API
int vkgdr_attached_memory_write(vkgdr_attached_memory_t mem,
                                size_t offset,
                                const void *src,
                                size_t size);

/**
 * Copies `size` bytes of the attached memory at `offset` into `dst`, invalidating first
 * (CPU loads: slow through a PCIe BAR, well under 1 GB/s).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the memory,
 * `dst` NULL with `size` > 0, an invalidate failure).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `dst` is writable for `size` bytes and does not overlap the memory.
 * - No thread detaches `mem` during the call.
 */
VKGDR_API
int vkgdr_attached_memory_read(vkgdr_attached_memory_t mem,
                               size_t offset,
                               void *dst,
                               size_t size);

/**
 * Whether the owner revoked the memory (as far as this process has read: `vkgdr_peer_poll`).
 * `false` also on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `mem` during the call.
 */
VKGDR_API bool vkgdr_attached_memory_is_revoked(vkgdr_attached_memory_t mem);

/**
 * Unmaps the memory and tells the owner. `NULL` is ignored.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already detached or not a
 * `vkgdr_attached_memory_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same handle.
 *
 * # Safety
 * - No other thread uses `mem` during or after the call, and nothing uses its host pointer
 *   any more.
 */
VKGDR_API void vkgdr_attached_memory_detach(vkgdr_attached_memory_t mem);

/**
 * Attaches the pool the owner shares as `name` (`vkgdr_share_pool`): its blocks then come
 * with `vkgdr_attached_pool_request` or from the owner (`vkgdr_attached_pool_next_block`).
 *
 * - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (as `vkgdr_peer_attach_memory`; a region that is
 * no pool).
 *
 * Thread safety: any thread. Detach it with `vkgdr_attached_pool_detach`.
 *
 * # Safety
 * - `name` is a NUL-terminated string; `out` is writable.
 * - No thread destroys `peer` during the call.
 */
VKGDR_API
int vkgdr_peer_attach_pool(vkgdr_peer_t peer,
                           const char *name,
                           vkgdr_attached_pool_t *out);

/**
 * The most bytes of blocks asked for (`vkgdr_attached_pool_request`) this process may hold
 * at once, or 0 on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `pool` during the call.
 */
VKGDR_API uint64_t vkgdr_attached_pool_get_quota(vkgdr_attached_pool_t pool);

/**
 * Asks the owner for a block of `size` bytes aligned to `align` (a power of two) and waits for
 * it (up to the connection's timeout).
 *
 * - `out`: where to store the block handle (NULL unless `VKGDR_SUCCESS`).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `out` NULL; a revoked pool; the
 * owner's refusal: `over quota`, `out of memory`, `bad request` for a size or alignment its
 * pool does not take; an owner that hung up or did not answer in time).
 *
 * Thread safety: any thread. Give the block back with `vkgdr_shared_block_release`.
 *
 * # Safety
 * - `out` is writable.
 * - No thread detaches `pool` during the call.
 */
VKGDR_API
int vkgdr_attached_pool_request(vkgdr_attached_pool_t pool,
                                size_t size,
                                size_t align,
                                vkgdr_shared_block_t *out);

/**
 * The next block the owner sent this process unasked (`vkgdr_share_send_block`), in the order
 * sent.
 *
 * - `timeout_ns`: how long to wait for one: 0 only looks, negative waits until one comes.
 * - `out`: where to store the block handle (NULL unless `VKGDR_SUCCESS`).
 *
 * Returns `VKGDR_SUCCESS`; `VKGDR_SHARE_NONE` if none came in time; or `VKGDR_ERROR` (an
 * invalid handle, `out` NULL, a revoked pool, an owner that hung up).
 *
 * Thread safety: any thread. Give the block back with `vkgdr_shared_block_release`.
 *
 * # Safety
 * - `out` is writable.
 * - No thread detaches `pool` during the call.
 */
VKGDR_API
int vkgdr_attached_pool_next_block(vkgdr_attached_pool_t pool,
                                   int64_t timeout_ns,
                                   vkgdr_shared_block_t *out);

/**
 * Detaches the pool. `NULL` is ignored. Refused (nothing happens) while blocks of the pool are
 * still held by live handles: give them back first (`vkgdr_shared_block_release`), since the
 * owner frees what a detached pool held and this process still maps those blocks' chunks.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already detached or not a
 * `vkgdr_attached_pool_t`; blocks still held.
 *
 * Thread safety: any thread, but not while another thread is using the same handle.
 *
 * # Safety
 * - No other thread uses `pool` during or after the call.
 */
VKGDR_API void vkgdr_attached_pool_detach(vkgdr_attached_pool_t pool);

/**
 * The block's host address (its `vkgdr_shared_block_get_size` bytes are this process's to
 * write), or `NULL` on error (an invalid handle). Stores through it are not checked for
 * revocation: `vkgdr_shared_block_write` is; on non-coherent memory `vkgdr_shared_block_flush`
 * makes them visible to the GPU.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread releases `block` during the call.
 */
VKGDR_API void *vkgdr_shared_block_get_host_ptr(vkgdr_shared_block_t block);

/**
 * The block's size as asked for (or as the owner allocated it), or 0 on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread releases `block` during the call.
 */
VKGDR_API size_t vkgdr_shared_block_get_size(vkgdr_shared_block_t block);

/**
 * The owner's token for the block (what its `VKGDR_SHARE_EVENT_RELEASED` and
 * `vkgdr_share_take_returned` name), or 0 on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread releases `block` during the call.
 */
VKGDR_API uint64_t vkgdr_shared_block_get_token(vkgdr_shared_block_t block);

/**
 * Whether the owner took the block (or its pool) back, as far as this process has read
 * (`vkgdr_peer_poll`). `false` also on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread releases `block` during the call.
 */
VKGDR_API bool vkgdr_shared_block_is_revoked(vkgdr_shared_block_t block);

/**
 * Copies `size` bytes from `src` into the block at `offset`, then flushes them.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle; a revoked block or pool,
 * nothing written; a range outside the block; `src` NULL with `size` > 0; a flush failure).
 *
 * Thread safety: any thread; concurrent writes to disjoint ranges are fine.
 *
 * # Safety
 * - `src` is readable for `size` bytes and does not overlap the block.
 * - No other thread of this process accesses the destination range during the call, or
 *   releases `block`.
 */
VKGDR_API
int vkgdr_shared_block_write(vkgdr_shared_block_t block,
                             size_t offset,
                             const void *src,
                             size_t size);

/**
 * Copies `size` bytes of the block at `offset` into `dst`, invalidating first.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block,
 * `dst` NULL with `size` > 0, an invalidate failure).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `dst` is writable for `size` bytes and does not overlap the block.
 * - No thread releases `block` during the call.
 */
VKGDR_API
int vkgdr_shared_block_read(vkgdr_shared_block_t block,
                            size_t offset,
                            void *dst,
                            size_t size);

/**
 * Makes stores through the block's host pointer to `[offset, offset + size)` visible to the
 * GPU (`SIZE_MAX`: to the block's end). A no-op on coherent memory, apart from the range check.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block,
 * `vkFlushMappedMemoryRanges failed (...)`).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread releases `block` during the call.
 */
VKGDR_API int vkgdr_shared_block_flush(vkgdr_shared_block_t block, size_t offset, size_t size);

/**
 * Makes the GPU's writes to `[offset, offset + size)` of the block visible to loads through
 * its host pointer (`SIZE_MAX`: to the block's end). A no-op on coherent memory, apart from the
 * range check.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block,
 * `vkInvalidateMappedMemoryRanges failed (...)`).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread releases `block` during the call.
 */
VKGDR_API int vkgdr_shared_block_invalidate(vkgdr_shared_block_t block, size_t offset, size_t size);

/**
 * Gives the block back to the owner (who frees it to its pool then, or takes it with what
 * was written: `vkgdr_share_take_returned`). `NULL` is ignored.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already released or not a
 * `vkgdr_shared_block_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same block.
 *
 * # Safety
 * - No other thread uses `block` during or after the call, and nothing uses its host pointer
 *   any more.
 */
VKGDR_API void vkgdr_shared_block_release(vkgdr_shared_block_t block);

/**
 * Attaches a lane of the ring the owner shares as `name` (`vkgdr_share_ring`): this process
 * becomes its producer (`vkgdr_attached_lane_push`), starting where the lane's last producer
 * stopped (`vkgdr_attached_lane_get_start`). Attaching the same name again borrows another
 * lane.
 *
 * - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (as `vkgdr_peer_attach_memory`; a region that is no
 * ring; `the owner refused: busy: ...` when every lane is taken).
 *
 * Thread safety: any thread. Detach it with `vkgdr_attached_lane_detach`.
 *
 * # Safety
 * - `name` is a NUL-terminated string; `out` is writable.
 * - No thread destroys `peer` during the call.
 */
VKGDR_API
int vkgdr_peer_attach_lane(vkgdr_peer_t peer,
                           const char *name,
                           vkgdr_attached_lane_t *out);

/**
 * Appends one record with the `size`-byte payload at `payload` to the lane and publishes it:
 * the bytes go straight into the owner's GPU memory, the tail to the owner, who checks it and
 * passes it on to the ring's consumer.
 *
 * - `timeout_ns`: how long to wait for the consumer to free space: negative waits forever, 0
 *   tries once.
 * - `seq`: NULL, or where to store the record's sequence number (numbered on from
 *   `vkgdr_attached_lane_get_start`'s, one per record of the lane).
 *
 * Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time (nothing written);
 * or `VKGDR_ERROR` (an invalid handle, `payload` NULL, a zero size or one larger than the lane
 * takes; a lane the owner stopped serving, with why: revoked, a tail it refused, its consumer
 * gone).
 *
 * Thread safety: any thread, concurrently (records reach the consumer in the order their
 * space was reserved).
 *
 * # Safety
 * - `payload` is readable for `size` bytes; `seq` is NULL or writable.
 * - No thread detaches `lane` during the call.
 */
VKGDR_API
int vkgdr_attached_lane_push(vkgdr_attached_lane_t lane,
                             const void *payload,
                             size_t size,
                             int64_t timeout_ns,
                             uint64_t *seq);

/**
 * Appends `count` records (`payloads[i]`, `sizes[i]` bytes each) and publishes them all with
 * one fence and one tail (a batch larger than the free space is published in pieces while
 * waiting for more). They are numbered on from the lane's last record: with one thread
 * pushing, from `vkgdr_attached_lane_get_start`'s sequence number plus the records pushed
 * before.
 *
 * - `timeout_ns`: as for `vkgdr_attached_lane_push`, for each wait.
 * - `written`: NULL, or where to store how many records were written (and published), also on
 *   `VKGDR_RING_FULL` and `VKGDR_ERROR`.
 *
 * Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time for a record (the ones
 * before it are published); or `VKGDR_ERROR` (as `vkgdr_attached_lane_push`; `payloads` or
 * `sizes` NULL with `count` > 0, a NULL payload or a bad size, checked before anything is
 * written; another thread's batch on the lane in flight).
 *
 * Thread safety: any thread; one batch at a time per lane (`vkgdr_attached_lane_push` of other
 * threads waits for it).
 *
 * # Safety
 * - `payloads` and `sizes` are readable for `count` entries; each `payloads[i]` is readable
 *   for `sizes[i]` bytes; `written` is NULL or writable.
 * - No thread detaches `lane` during the call.
 */
VKGDR_API
int vkgdr_attached_lane_push_batch(vkgdr_attached_lane_t lane,
                                   const void *const *payloads,
                                   const size_t *sizes,
                                   size_t count,
                                   int64_t timeout_ns,
                                   size_t *written);

/**
 * Whether the owner stopped serving the lane: revoked, refused a tail this process published,
 * or its consumer is gone. Records pushed from then on reach no consumer
 * (`vkgdr_attached_lane_get_stop_reason` says why). `false` also on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `lane` during the call.
 */
VKGDR_API bool vkgdr_attached_lane_is_stopped(vkgdr_attached_lane_t lane);

/**
 * Why the owner stopped serving the lane: a copy the caller releases with `free()`, or `NULL`
 * while it serves it (and on error: an invalid handle, reported through `vkgdr_last_error()`).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `lane` during the call.
 */
VKGDR_API char *vkgdr_attached_lane_get_stop_reason(vkgdr_attached_lane_t lane);

/**
 * What the owner has accepted from this lane and passed on to its consumer so far: the end of
 * the last accepted record (`tail`, bytes since the lane began) and the sequence number after
 * it (`seq`). Once `seq` reaches the number after the last record pushed, every record is on
 * its way to the consumer.
 *
 * - `tail`, `seq`: NULL, or where to store each.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `tail` and `seq` are NULL or writable.
 * - No thread detaches `lane` during the call.
 */
VKGDR_API
int vkgdr_attached_lane_get_accepted(vkgdr_attached_lane_t lane,
                                     uint64_t *tail,
                                     uint64_t *seq);

/**
 * Where this producer started: the lane's position (`tail`) and the sequence number of its
 * first record (`seq`), where the lane's previous producer stopped (0 and 0 for a new ring).
 *
 * - `tail`, `seq`: NULL, or where to store each.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `tail` and `seq` are NULL or writable.
 * - No thread detaches `lane` during the call.
 */
VKGDR_API
int vkgdr_attached_lane_get_start(vkgdr_attached_lane_t lane,
                                  uint64_t *tail,
                                  uint64_t *seq);

/**
 * The lane's number in the owner's ring (what the owner's consumer and
 * `vkgdr_ring_get_lane_results` know it by), or `UINT32_MAX` on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `lane` during the call.
 */
VKGDR_API uint32_t vkgdr_attached_lane_get_lane(vkgdr_attached_lane_t lane);

/**
 * The lane's capacity in bytes (the owner's ring's, per lane), or 0 on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread detaches `lane` during the call.
 */
VKGDR_API uint64_t vkgdr_attached_lane_get_capacity(vkgdr_attached_lane_t lane);

/**
 * Detaches the lane: the owner takes a last look at what it published (passing on what it
 * accepts) and takes the lane back there, for its next producer. `NULL` is ignored.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already detached or not a
 * `vkgdr_attached_lane_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same handle.
 *
 * # Safety
 * - No other thread uses `lane` during or after the call.
 */
VKGDR_API void vkgdr_attached_lane_detach(vkgdr_attached_lane_t lane);

/**
 * Fills `*config` with the default configuration and sets `config->struct_size` to
 * `struct_size`, which must be `sizeof(vkgdr_pool_config)` as the caller sees it (only that many
 * bytes are written).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if `config` is NULL or `struct_size` too small.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `config` is NULL or writable for `struct_size` bytes.
 */
VKGDR_API int vkgdr_pool_config_init(struct vkgdr_pool_config *config, size_t struct_size);

/**
 * Creates a pool of small aligned blocks over BAR-mapped chunks of `g`'s device. No chunk is
 * allocated until the first block needs one. On a `vkgdr_open` handle the chunks are imported
 * into the handle's context (the one current at `vkgdr_open` with
 * `VKGDR_OPEN_CURRENT_CONTEXT_BIT`, else the device's primary context); on a
 * `vkgdr_open_vulkan` handle they have no device address.
 *
 * - `config`: NULL for the defaults, or a configuration from `vkgdr_pool_config_init`.
 *
 * Returns a handle, or `NULL` on error (an invalid handle or configuration).
 *
 * Thread safety: any thread. The pool may be used from many threads at once.
 * Free it with `vkgdr_pool_destroy`.
 *
 * # Safety
 * - `config` is NULL or readable for `config->struct_size` bytes.
 * - No thread closes `g` during the call.
 */
VKGDR_API vkgdr_pool_t vkgdr_pool_create(vkgdr_t g, const struct vkgdr_pool_config *config);

/**
 * Destroys a pool handle. `NULL` is ignored. Blocks still allocated stay valid (they keep their
 * memory alive) until `vkgdr_block_free`; the memory is returned to the driver when the last
 * one is freed.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
 * `vkgdr_pool_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same pool handle.
 *
 * # Safety
 * - No other thread uses `pool` during or after the call.
 */
VKGDR_API void vkgdr_pool_destroy(vkgdr_pool_t pool);

/**
 * Allocates `size` bytes aligned to `alignment` (a power of two up to the pool's `max_align`,
 * 64 KiB by default) for both the host and the device address. Nanoseconds when a chunk has
 * room; otherwise a new chunk is allocated (hundreds of microseconds). The bytes are not
 * cleared.
 *
 * Returns a block handle, or `NULL` on error (a zero size, a bad alignment, the pool's
 * `max_bytes`, or the driver's out-of-memory `vkAllocateMemory failed
 * (VK_ERROR_OUT_OF_DEVICE_MEMORY)`).
 *
 * Thread safety: any thread, concurrently (threads are spread over the pool's shards).
 * Free the block with `vkgdr_block_free`, from any thread.
 *
 * # Safety
 * - No thread destroys `pool` during the call.
 */
VKGDR_API vkgdr_block_t vkgdr_pool_alloc(vkgdr_pool_t pool, size_t size, size_t alignment);

/**
 * Whether blocks of the pool are coherent (flushes and invalidates are then no-ops). `false`
 * also on error.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `pool` during the call.
 */
VKGDR_API bool vkgdr_pool_is_coherent(vkgdr_pool_t pool);

/**
 * Flushes every range recorded with `vkgdr_block_mark_written` or `vkgdr_block_write` in the
 * pool's shared chunks: one driver call per chunk with writes. A no-op on coherent memory.
 * (Blocks with a chunk of their own are flushed with `vkgdr_block_flush`.)
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, the driver's failure).
 *
 * Thread safety: any thread, concurrently with allocations and writes.
 *
 * # Safety
 * - No thread destroys `pool` during the call.
 */
VKGDR_API int vkgdr_pool_flush(vkgdr_pool_t pool);

/**
 * Returns every empty chunk to the driver now (blocks in use never move), first releasing the
 * calling thread's cached blocks of this pool. Other threads' caches are not reached.
 *
 * - `released`: NULL, or where to store the number of chunks released.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread, concurrently with allocations.
 *
 * # Safety
 * - `released` is NULL or writable.
 * - No thread destroys `pool` during the call.
 */
VKGDR_API int vkgdr_pool_trim(vkgdr_pool_t pool, size_t *released);

/**
 * Fills `*stats` (whose `struct_size` the caller sets) with a usage snapshot; takes each shard's
 * lock briefly.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `stats` NULL or its
 * `struct_size` unset).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `stats` is NULL or writable for `stats->struct_size` bytes.
 * - No thread destroys `pool` during the call.
 */
VKGDR_API int vkgdr_pool_get_stats(vkgdr_pool_t pool, struct vkgdr_pool_stats *stats);

/**
 * Frees a block (any thread may free any block). `NULL` is ignored.
 *
 * The block goes back to its pool at once, for the next `vkgdr_pool_alloc` to hand out again:
 * the pool cannot know which kernels still read it. Free a block that a kernel queued or
 * running may still use with `vkgdr_block_free_after`.
 *
 * Errors (reported through `vkgdr_last_error()` only): a block already freed or not a
 * `vkgdr_block_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same block.
 *
 * # Safety
 * - No other thread uses `block` during or after the call, and no kernel uses its memory any
 *   more.
 */
VKGDR_API void vkgdr_block_free(vkgdr_block_t block);

/**
 * Frees a block once the GPU work queued on `stream` so far has completed, without waiting for
 * it: for a block a kernel launched on `stream` (a persistent one included) may still use.
 * Returns at once; the block goes back to its pool only when the stream gets there, and counts
 * as in use until then (`vkgdr_wait_for_releases` on the pool's `vkgdr_t`,
 * `vkgdr_pool_get_stats`).
 *
 * - `block`: `NULL` is ignored (`VKGDR_SUCCESS`).
 * - `pool`: the pool the block came from, not yet destroyed (its device's CUDA side fences the
 *   release).
 * - `stream`: a live stream of the pool's device (a `CUstream`, or the runtime's
 *   `cudaStream_t`); `NULL` and `CU_STREAM_LEGACY` mean the pool context's legacy default
 *   stream (and so every blocking stream, such as the runtime's default stream).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`:
 * - nothing happened, the block is still the caller's: a block already freed or not a
 *   `vkgdr_block_t`, an invalid `pool`, a pool of a `vkgdr_open_vulkan` handle (no GPU work
 *   can use its blocks: free them with `vkgdr_block_free`);
 * - the block is freed after the pool context's legacy default stream instead: no fence could
 *   be had on `stream` (a stream the driver refuses, e.g. `cuStreamGetCtx failed
 *   (CUDA_ERROR_INVALID_HANDLE)`, or out of resources).
 *
 * Thread safety: any thread, but not while another thread is using the same block.
 *
 * # Safety
 * - No other thread uses `block` during or after the call; no thread destroys `pool` during
 *   the call.
 * - `stream` is NULL, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a stream not yet
 *   destroyed; where the driver lacks stream memory operations (then an event fences the
 *   release), its context stays alive until the release has happened.
 */
VKGDR_API int vkgdr_block_free_after(vkgdr_block_t block, vkgdr_pool_t pool, CUstream stream);

/**
 * The block's host address, or `NULL` on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread frees `block` during the call.
 */
VKGDR_API void *vkgdr_block_get_host_ptr(vkgdr_block_t block);

/**
 * The block's CUDA device address, or 0: on error (an invalid handle; `vkgdr_last_error()` is
 * set) and for pools of a `vkgdr_open_vulkan` handle (no error).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread frees `block` during the call.
 */
VKGDR_API CUdeviceptr vkgdr_block_get_device_ptr(vkgdr_block_t block);

/**
 * The block's size as asked for, or 0 on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread frees `block` during the call.
 */
VKGDR_API size_t vkgdr_block_get_size(vkgdr_block_t block);

/**
 * Records that `[offset, offset + size)` of the block was written through its host pointer, so
 * that the next `vkgdr_block_flush` or `vkgdr_pool_flush` pushes it: batch many blocks' writes
 * into one flush. Only checks the range on coherent memory.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block).
 *
 * Thread safety: any thread, also concurrently on the same block.
 *
 * # Safety
 * - No thread frees `block` during the call.
 */
VKGDR_API int vkgdr_block_mark_written(vkgdr_block_t block, size_t offset, size_t size);

/**
 * Makes host writes to `[offset, offset + size)` of the block visible to kernels launched
 * afterwards: records the range like `vkgdr_block_mark_written`, then flushes every recorded
 * range of the block's chunk in one driver call. Widened to whole atoms (blocks of non-coherent
 * pools own whole atoms, so no neighbour is disturbed). A no-op on coherent memory, apart from
 * the range check.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block, the
 * driver's failure).
 *
 * Thread safety: any thread, also concurrently on the same block.
 *
 * # Safety
 * - No thread frees `block` during the call.
 */
VKGDR_API int vkgdr_block_flush(vkgdr_block_t block, size_t offset, size_t size);

/**
 * Makes device writes to `[offset, offset + size)` of the block (by kernels that have completed)
 * visible to the host. The block's own unflushed writes are flushed first, so none is lost.
 * A no-op on coherent memory, apart from the range check.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block, the
 * driver's failure).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread frees `block` during the call.
 */
VKGDR_API int vkgdr_block_invalidate(vkgdr_block_t block, size_t offset, size_t size);

/**
 * Copies `size` bytes from `src` into the block at `offset` (the fast write-combining copy) and
 * records the range like `vkgdr_block_mark_written`: on non-coherent memory kernels see it after
 * `vkgdr_block_flush` or `vkgdr_pool_flush`.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block, `src`
 * NULL with `size` > 0).
 *
 * Thread safety: any thread; concurrent writes to disjoint ranges are fine.
 *
 * # Safety
 * - `src` is readable for `size` bytes and does not overlap the block.
 * - No other thread accesses the destination range during the call, or frees `block`.
 */
VKGDR_API int vkgdr_block_write(vkgdr_block_t block, size_t offset, const void *src, size_t size);

/**
 * Copies `size` bytes of the block at `offset` into `dst`, invalidating first (and flushing the
 * block's pending writes). Large reads of blocks with a device address use the GPU's copy engine.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block, `dst`
 * NULL with `size` > 0, a driver failure).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `dst` is writable for `size` bytes and does not overlap the block.
 * - No thread frees `block` during the call.
 */
VKGDR_API int vkgdr_block_read(vkgdr_block_t block, size_t offset, void *dst, size_t size);

/**
 * Creates the exclusive producer of one lane of `ring`: it claims a lane that has no producer
 * and no shared reservation in flight (the search starts after the lane the previous producer
 * took, so producers spread over the lanes). Records it writes are numbered 0, 1, 2, ... per
 * lane, continuing from what the lane's earlier producers and shared pushes wrote. The
 * producer keeps the ring alive: `vkgdr_ring_destroy` before `vkgdr_ring_producer_destroy` is
 * allowed (the ring then goes when the producer does).
 *
 * While a lane has a producer, `vkgdr_ring_push` and `vkgdr_ring_reserve` of threads that map
 * to that lane wait for it (give the producer threads lanes of their own: create the ring with
 * more lanes than producers when shared pushes are wanted too).
 *
 * Returns a handle, or `NULL` on error: an invalid handle; every lane has a producer already
 * ("every one of the ring's N lanes has a producer"); shared reservations in flight on the
 * only free lanes; the ring was stopped (`vkgdr_ring_stop`).
 *
 * Thread safety: any thread. The producer is for one thread at a time (calls on one producer
 * from several threads are serialised by a lock); it may move between threads.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API vkgdr_ring_producer_t vkgdr_ring_producer_create(vkgdr_ring_t ring);

/**
 * Destroys a producer: publishes what it has written and not yet published, and hands its
 * lane back (to a later producer, or to shared pushes). `NULL` is ignored. If the ring handle
 * was destroyed already and this was the last thing keeping the ring, the ring goes now (see
 * `vkgdr_ring_destroy`).
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
 * `vkgdr_ring_producer_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same producer.
 *
 * # Safety
 * - No other thread uses `producer` during or after the call.
 */
VKGDR_API void vkgdr_ring_producer_destroy(vkgdr_ring_producer_t producer);

/**
 * Appends one record with the `size`-byte payload at `payload` and publishes it at once,
 * together with anything written before (the lowest latency). A record of at least
 * `vkgdr_ring_options.copy_engine_record` bytes with 64 KiB written before it and not yet
 * published goes through pinned memory and a copy engine; a lone one takes the BAR.
 *
 * - `timeout_ns`: how long to wait for the consumer to free space: negative waits forever
 *   (until the watched consumer has exited), 0 tries once.
 * - `seq`: NULL, or where to store the record's sequence number in its lane.
 *
 * Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time (nothing written); or
 * `VKGDR_ERROR` (an invalid handle, `payload` NULL, a zero size or one larger than the ring
 * takes, a consumer that has stopped).
 *
 * Thread safety: any thread, one at a time per producer (see `vkgdr_ring_producer_create`).
 *
 * # Safety
 * - `payload` is readable for `size` bytes; `seq` is NULL or writable.
 * - No thread destroys `producer` during the call.
 */
VKGDR_API
int vkgdr_ring_producer_push(vkgdr_ring_producer_t producer,
                             const void *payload,
                             size_t size,
                             int64_t timeout_ns,
                             uint64_t *seq);

/**
 * Appends one record like `vkgdr_ring_producer_push` but publishes it only when the flush
 * policy says so (`vkgdr_ring_producer_set_flush_policy`; by default once 64 KiB wait), or at
 * the next push, `vkgdr_ring_producer_flush`, wait for space or destroy: many records then cost
 * one fence and one tail store. Call `vkgdr_ring_producer_flush` when a burst ends: nothing
 * publishes records that are left waiting otherwise.
 *
 * Returns and waits as `vkgdr_ring_producer_push`.
 *
 * Thread safety: any thread, one at a time per producer.
 *
 * # Safety
 * - `payload` is readable for `size` bytes; `seq` is NULL or writable.
 * - No thread destroys `producer` during the call.
 */
VKGDR_API
int vkgdr_ring_producer_write(vkgdr_ring_producer_t producer,
                              const void *payload,
                              size_t size,
                              int64_t timeout_ns,
                              uint64_t *seq);

/**
 * Appends `count` records (`payloads[i]`, `sizes[i]` bytes each) and publishes them all with
 * one fence and one tail store (a batch larger than the free space is published in pieces while
 * waiting for more). Their sequence numbers are `next_seq`, `next_seq + 1`, ... as
 * `vkgdr_ring_producer_get_next_seq` said before the call.
 *
 * - `timeout_ns`: as for `vkgdr_ring_producer_push`, for each wait.
 * - `written`: NULL, or where to store how many records were written (and published), also on
 *   `VKGDR_RING_FULL` and `VKGDR_ERROR`.
 *
 * Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time for a record (the ones
 * before it are published); or `VKGDR_ERROR` (an invalid handle, `payloads` or `sizes` NULL with
 * `count` > 0, a NULL payload, a zero size or one larger than the ring takes: the records
 * before it are published).
 *
 * Thread safety: any thread, one at a time per producer.
 *
 * # Safety
 * - `payloads` and `sizes` are readable for `count` entries; each `payloads[i]` is readable
 *   for `sizes[i]` bytes; `written` is NULL or writable.
 * - No thread destroys `producer` during the call.
 */
VKGDR_API
int vkgdr_ring_producer_push_batch(vkgdr_ring_producer_t producer,
                                   const void *const *payloads,
                                   const size_t *sizes,
                                   size_t count,
                                   int64_t timeout_ns,
                                   size_t *written);

/**
 * Publishes every record the producer has written and not yet published: one fence and one
 * tail store (nothing when nothing is waiting).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread, one at a time per producer.
 *
 * # Safety
 * - No thread destroys `producer` during the call.
 */
VKGDR_API int vkgdr_ring_producer_flush(vkgdr_ring_producer_t producer);

/**
 * Sets when `vkgdr_ring_producer_write` publishes: once `max_pending_bytes` bytes (records
 * with their headers) wait (0: every record at once), or once the oldest waiting record has
 * waited `max_delay_ns` nanoseconds (negative: no time bound), checked on each write — there is
 * no timer: a producer that goes idle calls `vkgdr_ring_producer_flush`. The default is 64 KiB
 * and no time bound.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread, one at a time per producer.
 *
 * # Safety
 * - No thread destroys `producer` during the call.
 */
VKGDR_API
int vkgdr_ring_producer_set_flush_policy(vkgdr_ring_producer_t producer,
                                         uint64_t max_pending_bytes,
                                         int64_t max_delay_ns);

/**
 * Sets how many bytes (records with their headers) of a batch not yet published a producer
 * writes through the BAR before it stages a record of `vkgdr_ring_options.copy_engine_record`
 * bytes or more for the copy engine; from its next record on. A producer starts at 64 KiB, so
 * that a lone large record or a short batch keeps the BAR, which is quicker for it. 0 stages
 * every such record, the first of a batch and a lone one included: for producers streaming
 * large records beside a lane whose lone records must arrive quickly, which otherwise wait
 * behind the BAR stores of those batches' first 64 KiB. `UINT64_MAX` stages none. No effect
 * on a lane whose records all take the BAR.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread, one at a time per producer.
 *
 * # Safety
 * - No thread destroys `producer` during the call.
 */
VKGDR_API int vkgdr_ring_producer_set_stage_after(vkgdr_ring_producer_t producer, uint64_t bytes);

/**
 * What `vkgdr_ring_producer_set_stage_after` last set (64 KiB at first), or `UINT64_MAX` on
 * error (an invalid handle; `UINT64_MAX` is also what a producer set to stage nothing holds).
 *
 * Thread safety: any thread, one at a time per producer.
 *
 * # Safety
 * - No thread destroys `producer` during the call.
 */
VKGDR_API uint64_t vkgdr_ring_producer_get_stage_after(vkgdr_ring_producer_t producer);

/**
 * The sequence number the producer's next record gets (in its lane), or `UINT64_MAX` on error
 * (an invalid handle).
 *
 * Thread safety: any thread, one at a time per producer.
 *
 * # Safety
 * - No thread destroys `producer` during the call.
 */
VKGDR_API uint64_t vkgdr_ring_producer_get_next_seq(vkgdr_ring_producer_t producer);

/**
 * The lane the producer owns (0 to lanes - 1: its consumer's head and result words are
 * `vkgdr_ring_get_lane_head` and `vkgdr_ring_get_lane_results` of it), or `UINT32_MAX` on
 * error (an invalid handle).
 *
 * Thread safety: any thread, one at a time per producer.
 *
 * # Safety
 * - No thread destroys `producer` during the call.
 */
VKGDR_API uint32_t vkgdr_ring_producer_get_lane(vkgdr_ring_producer_t producer);

/**
 * Creates a ring of `capacity` bytes (a power of two, at least 4096) in BAR-mapped memory of
 * `g`'s device, in the handle's context (see `vkgdr_pool_create`).
 *
 * - `flags`: 0, `VKGDR_RING_MIRRORED_BIT` or `VKGDR_RING_SHAREABLE_BIT` (its one lane can then
 *   be lent to another process: `vkgdr_share_ring`). `VKGDR_RING_COPY_ENGINE_SPLIT_BIT` needs
 *   a `copy_engine_record`, which only `vkgdr_ring_create_with_options` takes: it is refused
 *   here. `VKGDR_RING_COPY_ENGINE_OFF_BIT` is accepted and changes nothing: a one-lane ring
 *   writes every record through the BAR.
 *
 * Returns a handle, or `NULL` on error (a bad capacity or flag, a `vkgdr_open_vulkan` handle, a
 * driver failure).
 *
 * Thread safety: any thread. Pushes may come from many threads at once.
 * Free it with `vkgdr_ring_destroy` once the consumer is done.
 *
 * # Safety
 * - No thread closes `g` during the call.
 */
VKGDR_API vkgdr_ring_t vkgdr_ring_create(vkgdr_t g, uint64_t capacity, uint32_t flags);

/**
 * Fills `*options` with the defaults (one lane, padded, the copy engine chosen by the ring)
 * and sets `options->struct_size` to `struct_size`, which must be
 * `sizeof(vkgdr_ring_options)` as the caller sees it (only that many bytes are written).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if `options` is NULL or `struct_size` too small.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `options` is NULL or writable for `struct_size` bytes.
 */
VKGDR_API int vkgdr_ring_options_init(struct vkgdr_ring_options *options, size_t struct_size);

/**
 * Creates a ring of `options->lanes` lanes of `capacity` bytes each (a power of two, at least
 * 4096; for `VKGDR_RING_MIRRORED_BIT`, a multiple of the VMM granularity, 2 MiB on the H100)
 * in BAR-mapped memory of `g`'s device, in the handle's context (see `vkgdr_pool_create`).
 *
 * - `options`: NULL for the defaults (then it is `vkgdr_ring_create(g, capacity, 0)`), or
 *   options from `vkgdr_ring_options_init`. They are checked before `g`: unknown flag bits,
 *   lanes outside 1 to 64, a `copy_engine_record` above `UINT32_MAX`,
 *   `VKGDR_RING_COPY_ENGINE_SPLIT_BIT` with a `copy_engine_record` of 0 or with
 *   `VKGDR_RING_SHAREABLE_BIT`, `VKGDR_RING_COPY_ENGINE_OFF_BIT` with either of those, an
 *   unset `struct_size` or fields this version does not know set are errors.
 *
 * Which producer for which lane: `vkgdr_ring_producer_create` claims a lane for one thread
 * (records appended without locks, batches published with one fence and one tail store, large
 * records by the copy engine); `vkgdr_ring_push` / `vkgdr_ring_reserve` from any thread share
 * the calling thread's lane (thread index modulo the lane count) and publish every record on
 * its own.
 *
 * Returns a handle, or `NULL` on error (bad options or capacity, a `vkgdr_open_vulkan` handle,
 * a driver failure).
 *
 * Thread safety: any thread. Free it with `vkgdr_ring_destroy` once the consumer is done.
 *
 * # Safety
 * - `options` is NULL or readable for `options->struct_size` bytes.
 * - No thread closes `g` during the call.
 */
VKGDR_API
vkgdr_ring_t vkgdr_ring_create_with_options(vkgdr_t g,
                                            uint64_t capacity,
                                            const struct vkgdr_ring_options *options);

/**
 * Destroys a ring handle. `NULL` is ignored. Open reservations and producers
 * (`vkgdr_ring_producer_t`) keep the ring alive until they are committed, cancelled or
 * destroyed; when the last of them goes, the ring goes as described here. Sets the ring's
 * `stop` word (as `vkgdr_ring_stop`) and never waits: with a consumer registered by
 * `vkgdr_ring_watch_consumer`, the ring's memory is kept until that consumer has exited;
 * otherwise it is released after the legacy default stream's queued work, so a consumer on
 * another stream must have finished with it.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
 * `vkgdr_ring_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same ring.
 *
 * # Safety
 * - No other thread uses `ring` during or after the call; no kernel reads it any more, unless
 *   it is the consumer registered with `vkgdr_ring_watch_consumer`.
 */
VKGDR_API void vkgdr_ring_destroy(vkgdr_ring_t ring);

/**
 * Appends one record with the `size`-byte payload at `payload` and publishes it to the consumer
 * (records of all threads reach the consumer in the order their space was reserved).
 *
 * - `timeout_ns`: how long to wait for the consumer to free space: negative waits forever, 0
 *   tries once.
 * - `seq`: NULL, or where to store the record's sequence number (0, 1, 2, ... per ring).
 *
 * Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time (nothing written); or
 * `VKGDR_ERROR` (an invalid handle, `payload` NULL, a zero size or one larger than the ring
 * takes, a consumer head that makes no sense).
 *
 * Thread safety: any thread, concurrently.
 *
 * # Safety
 * - `payload` is readable for `size` bytes; `seq` is NULL or writable.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API
int vkgdr_ring_push(vkgdr_ring_t ring,
                    const void *payload,
                    size_t size,
                    int64_t timeout_ns,
                    uint64_t *seq);

/**
 * Reserves space for one record with a `size`-byte payload and gives it the next sequence
 * number, for producers that need the number in the payload or write it piece by piece:
 * write with `vkgdr_ring_reservation_write`, then `vkgdr_ring_commit`. Records are consumed in
 * reservation order; a reservation not yet committed holds back the records reserved after it,
 * so commit promptly (and never wait for ring space while holding one).
 *
 * - `timeout_ns`: as for `vkgdr_ring_push`.
 * - `reservation`: where to store the handle (set to NULL unless `VKGDR_SUCCESS`).
 *
 * Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time; or `VKGDR_ERROR` (an
 * invalid handle, `reservation` NULL, a zero size or one larger than the ring takes).
 *
 * Thread safety: any thread, concurrently.
 *
 * # Safety
 * - `reservation` is writable.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API
int vkgdr_ring_reserve(vkgdr_ring_t ring,
                       size_t size,
                       int64_t timeout_ns,
                       vkgdr_ring_reservation_t *reservation);

/**
 * The sequence number of a reserved record, or `UINT64_MAX` on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread commits or cancels `reservation` during the call.
 */
VKGDR_API uint64_t vkgdr_ring_reservation_get_seq(vkgdr_ring_reservation_t reservation);

/**
 * Copies `size` bytes from `src` to payload offset `offset` of a reserved record (into the
 * ring's BAR-mapped memory; a record of a mirrored ring may continue at the region's start,
 * which this handles).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the payload,
 * `src` NULL with `size` > 0).
 *
 * Thread safety: any thread; calls on one reservation are serialised.
 *
 * # Safety
 * - `src` is readable for `size` bytes.
 * - No thread commits or cancels `reservation` during the call.
 */
VKGDR_API
int vkgdr_ring_reservation_write(vkgdr_ring_reservation_t reservation,
                                 size_t offset,
                                 const void *src,
                                 size_t size);

/**
 * Commits a reserved record: it is published to the consumer as soon as every record reserved
 * before it is committed (possibly by this call, possibly by a later one of another thread).
 * Consumes the handle, also on error.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (a handle already committed or cancelled, or not a
 * reservation).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No other thread uses `reservation` during or after the call.
 */
VKGDR_API int vkgdr_ring_commit(vkgdr_ring_reservation_t reservation);

/**
 * Abandons a reserved record: it becomes a padding record the consumer skips (it keeps its
 * sequence number, so numbering stays gapless). Consumes the handle. `NULL` is ignored.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already committed or
 * cancelled, or not a reservation.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No other thread uses `reservation` during or after the call.
 */
VKGDR_API void vkgdr_ring_cancel(vkgdr_ring_reservation_t reservation);

/**
 * Fills `*view` (whose `struct_size` the caller sets) with the addresses a consumer kernel
 * needs.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `view` NULL or its `struct_size`
 * unset).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `view` is NULL or writable for `view->struct_size` bytes.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API int vkgdr_ring_get_device_view(vkgdr_ring_t ring, struct vkgdr_ring_device_view *view);

/**
 * Registers the ring's persistent consumer kernel, just launched on `stream`: records a CUDA
 * event there, after the launch. From then on a producer waiting for space (`vkgdr_ring_push`,
 * `vkgdr_ring_reserve` with a timeout) that the consumer will never free learns that it has
 * exited or died (`VKGDR_ERROR`, "the ring's consumer has stopped") instead of waiting out its
 * timeout, and `vkgdr_ring_destroy` keeps the ring's memory until the consumer has exited
 * without waiting for it. Call it again after launching a new consumer.
 *
 * - `stream`: the stream the consumer was launched on (a `CUstream`, or the runtime's
 *   `cudaStream_t`); `NULL` is the legacy default stream.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, the driver's failure to create
 * or record the event, e.g. `cuEventRecord failed (CUDA_ERROR_INVALID_HANDLE)` for a stream of
 * another context).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `stream` is NULL, a special stream handle or a stream not yet destroyed, of the ring's
 *   context.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API int vkgdr_ring_watch_consumer(vkgdr_ring_t ring, CUstream stream);

/**
 * Asks a persistent consumer to exit once it has consumed everything published (sets `stop`
 * after the last tail). Push nothing afterwards.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API int vkgdr_ring_stop(vkgdr_ring_t ring);

/**
 * The consumer's published head (how far it has consumed, in bytes since the start), read
 * from pinned host memory. `UINT64_MAX` on error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API uint64_t vkgdr_ring_get_head(vkgdr_ring_t ring);

/**
 * Copies the first `count` (at most 8) result words the consumer reported (the view's
 * `result`) into `words`. For the `ring_consume_*` kernels of `kernels/ring.cu`: records,
 * checksum sum, errors, next sequence number, position.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `words` NULL, `count` > 8).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `words` is writable for `count` values.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API int vkgdr_ring_get_results(vkgdr_ring_t ring, uint64_t *words, size_t count);

/**
 * Number of lanes of the ring (1 unless it was made with `vkgdr_ring_options.lanes`), or 0 on
 * error (an invalid handle).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API uint32_t vkgdr_ring_get_lanes(vkgdr_ring_t ring);

/**
 * `vkgdr_ring_get_head` of lane `lane`: how far the consumer of that lane has consumed.
 * `UINT64_MAX` on error (an invalid handle, no such lane).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API uint64_t vkgdr_ring_get_lane_head(vkgdr_ring_t ring, uint32_t lane);

/**
 * `vkgdr_ring_get_results` of lane `lane`: the first `count` (at most 8) result words its
 * consumer reported (at the view's `result + lane * 256`).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such lane, `words` NULL,
 * `count` > 8).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `words` is writable for `count` values.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API
int vkgdr_ring_get_lane_results(vkgdr_ring_t ring,
                                uint32_t lane,
                                uint64_t *words,
                                size_t count);

/**
 * Fills `*stats` (whose `struct_size` the caller sets) with what the copy-engine path of the
 * ring's lanes has done so far, over every lane.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `stats` NULL or its
 * `struct_size` unset).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `stats` is NULL or writable for `stats->struct_size` bytes.
 * - No thread destroys `ring` during the call.
 */
VKGDR_API
int vkgdr_ring_get_copy_engine_stats(vkgdr_ring_t ring,
                                     struct vkgdr_ring_copy_engine_stats *stats);

/**
 * Why the ring's copy-engine path could not be made (its lanes then carry every record through
 * the BAR): a copy the caller releases with `free()`, or `NULL` when the path is fine (or not
 * made yet, or off) and on error (an invalid handle, reported through `vkgdr_last_error()`).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `ring` during the call.
 */
VKGDR_API char *vkgdr_ring_get_copy_engine_error(vkgdr_ring_t ring);

/**
 * Fills `*options` with the defaults (same-user peers, socket mode 0600, blocks given back to
 * the owner) and sets `options->struct_size` to `struct_size`, which must be
 * `sizeof(vkgdr_share_options)` as the caller sees it (only that many bytes are written).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if `options` is NULL or `struct_size` too small.
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `options` is NULL or writable for `struct_size` bytes.
 */
VKGDR_API int vkgdr_share_options_init(struct vkgdr_share_options *options, size_t struct_size);

/**
 * Starts sharing with other processes of this host: listens on a Unix socket at `path` (a
 * file there from an earlier server that is gone is replaced; a live server's is an error)
 * for peers (`vkgdr_peer_connect`, from any process: no CUDA needed there) that map memory of
 * `g`'s GPU. Two threads of the library serve them: one answers peers, one passes the records
 * of remote ring producers on (after checking every tail).
 *
 * - `g`: a `vkgdr_open` handle, or a `vkgdr_open_vulkan` one (an owner without CUDA: it shares
 *   `vkgdr_memory_alloc_shareable` memory and pools of that handle). What is shared must be
 *   memory of this device.
 * - `path`: the socket's path (at most 107 bytes, as Unix sockets go).
 * - `options`: NULL for the defaults, or options from `vkgdr_share_options_init`.
 * - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle or option, a NULL pointer, the
 * socket's failure, e.g. `bind failed (EADDRINUSE)`).
 *
 * Thread safety: any thread; every `vkgdr_share_*` call on the server may come from any thread,
 * concurrently. Free it with `vkgdr_share_server_destroy`.
 *
 * # Safety
 * - `path` is a NUL-terminated string; `options` is NULL or readable for
 *   `options->struct_size` bytes (and its `uids` as it says); `out` is writable.
 * - No thread closes `g` during the call.
 */
VKGDR_API
int vkgdr_share_server_create(vkgdr_t g,
                              const char *path,
                              const struct vkgdr_share_options *options,
                              vkgdr_share_server_t *out);

/**
 * Stops sharing: disconnects every peer, gives every lent ring lane back to its ring, frees
 * the blocks peers held or gave back and no one took (their pools stay), removes the socket
 * file. Memory a peer mapped stays mapped in that peer (and so allocated) until it detaches or
 * exits. Waits for the server's two threads to end (a few milliseconds). `NULL` is ignored.
 *
 * Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
 * `vkgdr_share_server_t`.
 *
 * Thread safety: any thread, but not while another thread is using the same server.
 *
 * # Safety
 * - No other thread uses `server` during or after the call.
 */
VKGDR_API void vkgdr_share_server_destroy(vkgdr_share_server_t server);

/**
 * Shares `mem` under `name` (1 to 64 bytes of UTF-8, no control characters): a peer that
 * attaches it (`vkgdr_peer_attach_memory`) maps all of it and writes it with CPU stores. The
 * server keeps an fd of the memory, so its bytes stay allocated while they are shared (and
 * while a peer maps them), even after `vkgdr_memory_free`.
 *
 * - `mem`: memory from `vkgdr_memory_alloc_shareable` on this server's device
 *   (`vkgdr_memory_alloc`'s small allocations are carved out of memory other allocations
 *   share, and are refused).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a bad or taken name, carved
 * memory, the driver's failure to export it).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `name` is a NUL-terminated string.
 * - No thread destroys `server` or frees `mem` during the call.
 */
VKGDR_API int vkgdr_share_memory(vkgdr_share_server_t server, const char *name, vkgdr_memory_t mem);

/**
 * Shares `pool` under `name`: a peer that attaches it (`vkgdr_peer_attach_pool`) receives
 * blocks, sent by the owner (`vkgdr_share_send_block`) or asked for by the peer
 * (`vkgdr_attached_pool_request`, up to `quota` bytes held at once). A peer maps every chunk it
 * receives a block of whole, so it can reach the other blocks of those chunks: share a pool of
 * its own, holding only what peers may see.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a bad or taken name).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `name` is a NUL-terminated string.
 * - No thread destroys `server` or `pool` during the call.
 */
VKGDR_API
int vkgdr_share_pool(vkgdr_share_server_t server,
                     const char *name,
                     vkgdr_pool_t pool,
                     uint64_t quota);

/**
 * Shares the lanes of `ring` under `name`: each attachment (`vkgdr_peer_attach_lane`) borrows
 * one free lane (the first that no producer owns and no peer has) and becomes its producer;
 * its records go straight into the lane's GPU memory, and the server checks each tail it
 * publishes before passing it on to the ring's consumer. When every lane is taken, a peer's
 * attach is refused (busy). A lane comes back when its peer detaches, dies or is revoked, and
 * its next producer starts where the last accepted record ends.
 *
 * - `ring`: made with `VKGDR_RING_SHAREABLE_BIT` (`vkgdr_ring_create` or the options'
 *   `flags`).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a ring made without
 * `VKGDR_RING_SHAREABLE_BIT`, a bad or taken name).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `name` is a NUL-terminated string.
 * - No thread destroys `server` or `ring` during the call.
 */
VKGDR_API int vkgdr_share_ring(vkgdr_share_server_t server, const char *name, vkgdr_ring_t ring);

/**
 * Stops sharing `name`: no new attachment; existing ones stay until detached, revoked or gone.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, nothing shared under `name`).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `name` is a NUL-terminated string.
 * - No thread destroys `server` during the call.
 */
VKGDR_API int vkgdr_share_unshare(vkgdr_share_server_t server, const char *name);

/**
 * Sends a block to `peer`, which attached the pool shared as `name`, and takes the block
 * handle: the peer receives it (`vkgdr_attached_pool_next_block`), writes and reads it, and
 * gives it back; the server keeps the block allocated until then (or until the peer is gone),
 * and with `return_blocks` (the default) it comes back to the owner
 * (`VKGDR_SHARE_EVENT_RELEASED`, then `vkgdr_share_take_returned` with the token) with what
 * the peer wrote.
 *
 * - `peer`: the peer's number (`vkgdr_share_event.peer` of its `VKGDR_SHARE_EVENT_CONNECTED`
 *   or `_ATTACHED`).
 * - `block`: a block of the shared pool.
 * - `token`: NULL, or where to store the block's token.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`. The block handle is gone after the call, unless
 * the call failed on an invalid or NULL argument (an invalid server or block handle, a NULL or
 * non-UTF-8 name): then nothing happened and the block is still the caller's. Once the
 * server tried to send it (no such peer, a peer that did not attach the pool, a peer that does
 * not read its messages, which is then disconnected), a failure frees the block back to its
 * pool.
 *
 * Thread safety: any thread, but not while another thread is using the same block.
 *
 * # Safety
 * - `name` is a NUL-terminated string; `token` is NULL or writable.
 * - No thread destroys `server` during the call; no other thread uses `block` during or after
 *   it.
 */
VKGDR_API
int vkgdr_share_send_block(vkgdr_share_server_t server,
                           uint64_t peer,
                           const char *name,
                           vkgdr_block_t block,
                           uint64_t *token);

/**
 * Takes the block `token` that a peer gave back (`VKGDR_SHARE_EVENT_RELEASED`), with what the
 * peer wrote into it, as a new block handle of its pool: read it, send it again, free it.
 * Blocks given back wait in the server until taken or the server is destroyed.
 *
 * - `out`: where to store the block handle (NULL unless `VKGDR_SUCCESS`).
 *
 * Returns `VKGDR_SUCCESS`; `VKGDR_SHARE_NONE` when no block was given back under `token` (not
 * yet, taken already, revoked, or the server runs with `return_blocks` 0); or `VKGDR_ERROR` (an
 * invalid handle, `out` NULL).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `out` is writable.
 * - No thread destroys `server` during the call.
 */
VKGDR_API
int vkgdr_share_take_returned(vkgdr_share_server_t server,
                              uint64_t token,
                              vkgdr_block_t *out);

/**
 * Revokes everything `peer` holds and disconnects it: its ring lanes stop at once (nothing it
 * publishes from now on reaches a consumer), its writes through the handles of its attached
 * memory and blocks are refused once it has read the revocation (`vkgdr_peer_poll`, or any
 * call that waits for the owner). Its blocks and lanes go back when the peer has exited or
 * closed its end (its mappings live until then, so nothing it may still write lands in memory
 * handed to someone else).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such peer).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `server` during the call.
 */
VKGDR_API int vkgdr_share_revoke(vkgdr_share_server_t server, uint64_t peer);

/**
 * Takes one block back from `peer`: the peer is told, and its writes through that block are
 * refused once it has read that (`vkgdr_peer_poll`); the block is freed to its pool once the
 * peer gives it back or is gone, never before. A revoked block does not come back to the
 * owner (`vkgdr_share_take_returned`).
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such peer, a token the peer
 * does not hold).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - No thread destroys `server` during the call.
 */
VKGDR_API int vkgdr_share_revoke_block(vkgdr_share_server_t server, uint64_t peer, uint64_t token);

/**
 * The server's next event, in order: peers connecting, attaching, giving blocks back,
 * detaching, misbehaving, going. The server keeps the last 4096 events unread; older ones
 * are dropped.
 *
 * - `timeout_ns`: how long to wait for one: 0 only looks, negative waits until one comes.
 * - `event`: filled (as far as its `struct_size` reaches) when one came.
 *
 * Returns `VKGDR_SUCCESS` with `*event` filled; `VKGDR_SHARE_NONE` if none came in time
 * (`*event` untouched); or `VKGDR_ERROR` (an invalid handle, `event` NULL or its
 * `struct_size` unset).
 *
 * Thread safety: any thread; each event goes to one caller.
 *
 * # Safety
 * - `event` is NULL or writable for `event->struct_size` bytes.
 * - No thread destroys `server` during the call.
 */
VKGDR_API
int vkgdr_share_next_event(vkgdr_share_server_t server,
                           int64_t timeout_ns,
                           struct vkgdr_share_event *event);

/**
 * Fills `*stats` (whose `struct_size` the caller sets) with the server's counters.
 *
 * Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `stats` NULL or its
 * `struct_size` unset).
 *
 * Thread safety: any thread.
 *
 * # Safety
 * - `stats` is NULL or writable for `stats->struct_size` bytes.
 * - No thread destroys `server` during the call.
 */
VKGDR_API int vkgdr_share_get_stats(vkgdr_share_server_t server, struct vkgdr_share_stats *stats);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* VKGDR_H */
