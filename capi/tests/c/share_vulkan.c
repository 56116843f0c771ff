/* Sharing from C between processes, with no CUDA anywhere (Mesa's lavapipe on CI), for coherent
 * memory and with FORCE_NON_COHERENT (every flush and invalidate really issued):
 * - an owner on a Vulkan-only handle (vkgdr_open_vulkan) shares raw memory
 *   (vkgdr_memory_alloc_shareable) and a pool under names, then forks and execs this program
 *   as a peer, whose VKGDR_CUDA_LIBRARY names a library that does not exist;
 * - the peer attaches the memory, reads the owner's pattern, writes its own (checked write and
 *   stores through the host pointer); asks for a pool block, fills it and gives it back; takes
 *   the block the owner sends unasked, answers in it and gives it back; and tries the mistakes:
 *   NULL, forged and cross-type handles, a name nothing is shared under (the error names it),
 *   a region of the wrong kind, out-of-bounds writes, a pool detached while a block is held,
 *   detaching and releasing twice;
 * - the owner follows the events, takes the blocks back and checks what the peer wrote, then
 *   the owner-side mistakes; revokes a peer and a block (writes then refused); a policy that
 *   refuses this uid; a second server on a live socket; a peer whose server is gone (attach
 *   refused, what it mapped still readable, a new connect naming ENOENT); use after destroy.
 * Usage: share_vulkan        (the owner; "share_vulkan peer PATH c|nc" is the peer it starts) */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>

#include "check.h"
#include "peer_process.h"

#define MEM_SIZE (64u << 10)
#define QUOTA (1u << 20)
#define WAIT_NS 30000000000ll

/* --- The peer process ------------------------------------------------------------------------ */

static int peer_main(const char *path, int non_coherent)
{
    const char *cuda = getenv("VKGDR_CUDA_LIBRARY");
    vkgdr_peer_t peer = NULL;
    vkgdr_attached_memory_t m = NULL, none = NULL;
    vkgdr_attached_pool_t pool = NULL, no_pool = NULL;
    vkgdr_attached_lane_t lane = NULL;
    vkgdr_shared_block_t b = NULL;
    unsigned char *buf = malloc(MEM_SIZE), *p;

    /* No CUDA in this process: the library it is pointed at does not exist. */
    CHECK(cuda != NULL && strcmp(cuda, PEER_NO_CUDA) == 0, "VKGDR_CUDA_LIBRARY=%s",
          cuda ? cuda : "(unset)");
    CHECK(vkgdr_open(0, 0) == NULL, "CUDA opened in the peer");
    CHECK(last_error_contains("libcuda.so.1"), "the missing library is named");

    CHECK(vkgdr_peer_connect(path, 0, &peer) == VKGDR_SUCCESS && peer != NULL, "connect");
    CHECK(vkgdr_peer_attach_memory(peer, "params", &m) == VKGDR_SUCCESS && m != NULL, "attach");
    CHECK(vkgdr_attached_memory_get_size(m) == MEM_SIZE, "size %zu",
          vkgdr_attached_memory_get_size(m));
    CHECK(vkgdr_attached_memory_is_coherent(m) == !non_coherent, "the owner's coherence");
    CHECK(!vkgdr_attached_memory_is_revoked(m), "not revoked");
    memset(buf, 0, MEM_SIZE);
    CHECK(vkgdr_attached_memory_read(m, 0, buf, MEM_SIZE) == VKGDR_SUCCESS, "read");
    CHECK(matches(buf, MEM_SIZE, 1), "the owner's pattern, read by the peer");
    /* Our pattern: the first half by the checked write, the second through the host pointer
     * and a flush to the end. */
    fill(buf, MEM_SIZE, 2);
    CHECK(vkgdr_attached_memory_write(m, 0, buf, MEM_SIZE / 2) == VKGDR_SUCCESS, "write");
    CHECK(vkgdr_attached_memory_invalidate(m, 0, SIZE_MAX) == VKGDR_SUCCESS, "invalidate");
    p = vkgdr_attached_memory_get_host_ptr(m);
    CHECK(p != NULL, "host pointer");
    if (p != NULL) {
        memcpy(p + MEM_SIZE / 2, buf + MEM_SIZE / 2, MEM_SIZE / 2);
    }
    CHECK(vkgdr_attached_memory_flush(m, MEM_SIZE / 2, SIZE_MAX) == VKGDR_SUCCESS, "flush");
    /* Out of bounds: refused, nothing written. */
    CHECK(vkgdr_attached_memory_write(m, MEM_SIZE - 3, buf, 4) == VKGDR_ERROR, "past the end");
    CHECK(last_error_contains("vkgdr_attached_memory_write: range 65533+4 is outside the 65536"),
          "explains");
    CHECK(vkgdr_attached_memory_read(m, MEM_SIZE, buf, 1) == VKGDR_ERROR, "read past the end");
    CHECK(vkgdr_attached_memory_flush(m, MEM_SIZE + 1, SIZE_MAX) == VKGDR_ERROR,
          "flush past the end");
    CHECK(vkgdr_attached_memory_write(m, 0, NULL, 4) == VKGDR_ERROR, "NULL source");
    CHECK(last_error_contains("source pointer is NULL"), "explains");

    /* Mistakes: errors, never crashes. */
    CHECK(vkgdr_peer_attach_memory(peer, "nope", &none) == VKGDR_ERROR && none == NULL,
          "a name nothing is shared under");
    CHECK(last_error_contains("no such region: nothing is shared as \"nope\""), "names it");
    CHECK(vkgdr_peer_attach_pool(peer, "params", &no_pool) == VKGDR_ERROR, "memory as a pool");
    CHECK(last_error_contains("\"params\" is not a pool"), "explains");
    CHECK(vkgdr_peer_attach_lane(peer, "params", &lane) == VKGDR_ERROR && lane == NULL,
          "memory as a ring");
    CHECK(last_error_contains("\"params\" is not a ring"), "explains");
    CHECK(vkgdr_peer_attach_memory(NULL, "params", &none) == VKGDR_ERROR, "NULL peer");
    CHECK(last_error_contains("vkgdr_peer_attach_memory: the vkgdr_peer_t handle is NULL"),
          "explains");
    CHECK(vkgdr_peer_attach_memory((vkgdr_peer_t)m, "params", &none) == VKGDR_ERROR,
          "memory handle as a peer");
    CHECK(last_error_contains("invalid vkgdr_peer_t handle"), "explains");
    CHECK(vkgdr_peer_attach_memory((vkgdr_peer_t)(uintptr_t)0x5000000090000001ull, "params",
                                   &none) == VKGDR_ERROR,
          "a made-up peer");
    CHECK(last_error_contains("invalid vkgdr_peer_t handle"), "explains");
    CHECK(vkgdr_peer_attach_memory(peer, NULL, &none) == VKGDR_ERROR, "NULL name");
    CHECK(last_error_contains("the name pointer is NULL"), "explains");
    CHECK(vkgdr_peer_attach_memory(peer, "params", NULL) == VKGDR_ERROR, "NULL out");
    CHECK(last_error_contains("the memory pointer is NULL"), "explains");
    CHECK(vkgdr_attached_memory_write((vkgdr_attached_memory_t)peer, 0, buf, 1) == VKGDR_ERROR,
          "peer handle as memory");
    CHECK(last_error_contains("invalid vkgdr_attached_memory_t handle"), "explains");
    CHECK(vkgdr_attached_memory_get_size(NULL) == 0, "NULL memory");
    CHECK(last_error_contains("the vkgdr_attached_memory_t handle is NULL"), "explains");
    CHECK(vkgdr_attached_lane_push(NULL, buf, 16, 0, NULL) == VKGDR_ERROR, "NULL lane");
    CHECK(last_error_contains("the vkgdr_attached_lane_t handle is NULL"), "explains");
    CHECK(vkgdr_peer_poll(peer) == VKGDR_SUCCESS, "poll");

    /* A pool: a block asked for, filled and given back. */
    CHECK(vkgdr_peer_attach_pool(peer, "frames", &pool) == VKGDR_SUCCESS, "attach pool");
    CHECK(vkgdr_attached_pool_get_quota(pool) == QUOTA, "quota");
    CHECK(vkgdr_attached_pool_request(pool, 100, 64, &b) == VKGDR_SUCCESS && b != NULL,
          "request");
    CHECK(vkgdr_shared_block_get_size(b) == 100 &&
              (uintptr_t)vkgdr_shared_block_get_host_ptr(b) % 64 == 0 &&
              vkgdr_shared_block_get_token(b) != 0 && !vkgdr_shared_block_is_revoked(b),
          "the block asked for");
    fill(buf, 100, 10);
    CHECK(vkgdr_shared_block_write(b, 0, buf, 100) == VKGDR_SUCCESS, "block write");
    CHECK(vkgdr_shared_block_write(b, 97, buf, 4) == VKGDR_ERROR, "block write past the end");
    CHECK(last_error_contains("outside the 100-byte"), "explains");
    memset(buf, 0, 100);
    CHECK(vkgdr_shared_block_read(b, 0, buf, 100) == VKGDR_SUCCESS && matches(buf, 100, 10),
          "block read");
    mark_last_error();
    vkgdr_shared_block_release(b);
    CHECK(still_marked(), "release");
    vkgdr_shared_block_release(b);
    CHECK(last_error_contains("vkgdr_shared_block_release: invalid vkgdr_shared_block_t handle"),
          "released twice");
    CHECK(vkgdr_attached_pool_request(pool, 2u << 20, 64, &b) == VKGDR_ERROR && b == NULL,
          "past the quota");
    CHECK(last_error_contains("over quota"), "explains");
    /* The block the owner sends unasked: its tag, then ours. */
    CHECK(vkgdr_attached_pool_next_block(pool, WAIT_NS, &b) == VKGDR_SUCCESS && b != NULL,
          "a block from the owner");
    memset(buf, 0, 512);
    CHECK(vkgdr_shared_block_get_size(b) == 512, "its size");
    CHECK(vkgdr_shared_block_invalidate(b, 0, SIZE_MAX) == VKGDR_SUCCESS, "invalidate");
    CHECK(vkgdr_shared_block_read(b, 0, buf, 512) == VKGDR_SUCCESS && matches(buf, 512, 77),
          "the owner's tag");
    vkgdr_attached_pool_detach(pool);
    CHECK(last_error_contains("1 blocks of this pool are still held"),
          "a pool is not detached under its blocks");
    fill(buf, 512, 78);
    p = vkgdr_shared_block_get_host_ptr(b);
    if (p != NULL) {
        memcpy(p, buf, 512);
    }
    CHECK(vkgdr_shared_block_flush(b, 0, SIZE_MAX) == VKGDR_SUCCESS, "flush");
    CHECK(vkgdr_shared_block_flush(b, 1, 512) == VKGDR_ERROR, "flush past the end");
    mark_last_error();
    vkgdr_shared_block_release(b);
    vkgdr_attached_pool_detach(pool);
    CHECK(still_marked(), "release, then detach");
    CHECK(vkgdr_attached_pool_next_block(pool, 0, &b) == VKGDR_ERROR, "detached pool");
    CHECK(last_error_contains("invalid vkgdr_attached_pool_t handle"), "explains");

    /* Detach twice, use after detach, destroy twice. */
    mark_last_error();
    vkgdr_attached_memory_detach(m);
    CHECK(still_marked(), "detach");
    vkgdr_attached_memory_detach(m);
    CHECK(last_error_contains("vkgdr_attached_memory_detach: invalid vkgdr_attached_memory_t"),
          "detached twice");
    CHECK(vkgdr_attached_memory_read(m, 0, buf, 4) == VKGDR_ERROR, "use after detach");
    CHECK(last_error_contains("already freed"), "explains");
    mark_last_error();
    vkgdr_peer_destroy(peer);
    vkgdr_peer_destroy(NULL);
    CHECK(still_marked(), "destroy");
    vkgdr_peer_destroy(peer);
    CHECK(last_error_contains("vkgdr_peer_destroy: invalid vkgdr_peer_t handle"),
          "destroyed twice");
    free(buf);
    return CHECK_SUMMARY("share_vulkan (peer)");
}

/* --- The owner ------------------------------------------------------------------------------- */

/* The next event of `server` that is of `kind` (others are skipped), within 30 s. */
static int wait_event(vkgdr_share_server_t server, uint32_t kind, vkgdr_share_event *e)
{
    time_t start = time(NULL);
    while (time(NULL) - start < 30) {
        e->struct_size = sizeof *e;
        if (vkgdr_share_next_event(server, 100000000, e) == VKGDR_SUCCESS && e->kind == kind) {
            return 1;
        }
    }
    fprintf(stderr, "  no event of kind %u within 30 s\n", kind);
    return 0;
}

/* Polls `peer` until `cond` holds (or 10 s pass); the owner may hang up meanwhile. */
#define POLL_UNTIL(peer, cond)                                                             \
    do {                                                                                   \
        int tries_;                                                                        \
        for (tries_ = 0; tries_ < 2000 && !(cond); tries_++) {                             \
            (void)vkgdr_peer_poll(peer);                                                   \
            sleep_ms(5);                                                                   \
        }                                                                                  \
    } while (0)

/* Revocation and refusal, with a peer in this process. */
static void revoke_and_refuse(vkgdr_share_server_t server, vkgdr_pool_t pool, const char *path)
{
    vkgdr_share_event e;
    vkgdr_share_options o;
    vkgdr_share_server_t strict = NULL, second = NULL;
    vkgdr_peer_t me = NULL;
    vkgdr_attached_memory_t mm = NULL;
    vkgdr_attached_pool_t pp = NULL;
    vkgdr_shared_block_t sb = NULL;
    vkgdr_block_t blk;
    uint64_t id = 0, token = 0;
    unsigned char byte = 5, buf[64];
    char strict_path[160];
    uint32_t other_uid = (uint32_t)getuid() + 1;

    CHECK(vkgdr_peer_connect(path, 0, &me) == VKGDR_SUCCESS, "connect in-process");
    CHECK(wait_event(server, VKGDR_SHARE_EVENT_CONNECTED, &e) && e.pid == (int32_t)getpid(),
          "connected: pid %d", e.pid);
    id = e.peer;
    CHECK(vkgdr_peer_attach_memory(me, "params", &mm) == VKGDR_SUCCESS, "attach memory");
    CHECK(vkgdr_peer_attach_pool(me, "frames", &pp) == VKGDR_SUCCESS, "attach pool");
    CHECK(wait_event(server, VKGDR_SHARE_EVENT_ATTACHED, &e) && e.peer == id &&
              strcmp(e.text, "params") == 0 && e.text_len == 6,
          "attached params");
    CHECK(wait_event(server, VKGDR_SHARE_EVENT_ATTACHED, &e) && strcmp(e.text, "frames") == 0,
          "attached frames");
    blk = vkgdr_pool_alloc(pool, 64, 64);
    CHECK(vkgdr_share_send_block(server, id, "frames", blk, &token) == VKGDR_SUCCESS, "send");
    CHECK(vkgdr_attached_pool_next_block(pp, WAIT_NS, &sb) == VKGDR_SUCCESS, "received");
    CHECK(vkgdr_shared_block_write(sb, 0, &byte, 1) == VKGDR_SUCCESS, "write before revoking");

    /* One block, then everything the peer holds. */
    CHECK(vkgdr_share_revoke_block(server, id, token) == VKGDR_SUCCESS, "revoke the block");
    POLL_UNTIL(me, vkgdr_shared_block_is_revoked(sb));
    CHECK(vkgdr_shared_block_is_revoked(sb), "the peer saw it");
    CHECK(vkgdr_shared_block_write(sb, 0, &byte, 1) == VKGDR_ERROR, "write after revoking");
    CHECK(last_error_contains("revoked by the owner"), "explains");
    CHECK(vkgdr_share_revoke_block(server, id, token + 100) == VKGDR_ERROR, "unknown token");
    CHECK(last_error_contains("holds no block"), "explains");
    CHECK(vkgdr_share_revoke(server, id) == VKGDR_SUCCESS, "revoke the peer");
    POLL_UNTIL(me, vkgdr_attached_memory_is_revoked(mm));
    CHECK(vkgdr_attached_memory_is_revoked(mm), "the peer saw it");
    CHECK(vkgdr_attached_memory_write(mm, 0, &byte, 1) == VKGDR_ERROR, "write after revoking");
    CHECK(last_error_contains("revoked by the owner"), "explains");
    CHECK(vkgdr_attached_memory_read(mm, 0, buf, sizeof buf) == VKGDR_SUCCESS &&
              matches(buf, sizeof buf, 2),
          "still mapped and readable");
    CHECK(wait_event(server, VKGDR_SHARE_EVENT_GONE, &e) && e.peer == id, "gone");
    CHECK(vkgdr_peer_poll(me) == VKGDR_ERROR, "the owner disconnected the revoked peer");
    CHECK(last_error_contains("hung up"), "explains");
    /* A revoked block goes back to its pool, not to the owner. */
    vkgdr_shared_block_release(sb);
    vkgdr_attached_pool_detach(pp);
    vkgdr_attached_memory_detach(mm);
    vkgdr_peer_destroy(me);
    CHECK(vkgdr_share_take_returned(server, token, &blk) == VKGDR_SHARE_NONE && blk == NULL,
          "a revoked block is not returned");

    /* A policy that lets in another uid only: this process is turned away. */
    snprintf(strict_path, sizeof strict_path, "%s.strict", path);
    vkgdr_share_options_init(&o, sizeof o);
    o.peers = VKGDR_SHARE_PEERS_UIDS;
    o.uids = &other_uid;
    o.uid_count = 1;
    {
        vkgdr_t g = vkgdr_open_vulkan(-1, 0);
        CHECK(vkgdr_share_server_create(g, strict_path, &o, &strict) == VKGDR_SUCCESS,
              "strict server");
        vkgdr_close(g);
    }
    CHECK(vkgdr_peer_connect(strict_path, 2000000000ull, &me) == VKGDR_SUCCESS, "connect");
    CHECK(vkgdr_peer_attach_memory(me, "params", &mm) == VKGDR_ERROR, "refused");
    CHECK(wait_event(strict, VKGDR_SHARE_EVENT_REFUSED, &e) && e.pid == (int32_t)getpid() &&
              e.uid == (uint32_t)getuid() && strstr(e.text, "may attach") != NULL,
          "refused by the policy: %s", e.text);
    vkgdr_peer_destroy(me);
    {
        vkgdr_share_stats s;
        s.struct_size = sizeof s;
        CHECK(vkgdr_share_get_stats(strict, &s) == VKGDR_SUCCESS && s.refused == 1 &&
                  s.connected == 0,
              "refused %llu, connected %llu", (unsigned long long)s.refused,
              (unsigned long long)s.connected);
    }
    vkgdr_share_server_destroy(strict);

    /* A second server on a live server's socket. */
    {
        vkgdr_t g = vkgdr_open_vulkan(-1, 0);
        CHECK(vkgdr_share_server_create(g, path, NULL, &second) == VKGDR_ERROR && second == NULL,
              "a live socket is not taken over");
        CHECK(last_error_contains("bind failed (EADDRINUSE)"), "explains");
        vkgdr_close(g);
    }
}

static void run_owner(int non_coherent)
{
    char path[128], *args[5];
    vkgdr_t g = vkgdr_open_vulkan(-1, non_coherent ? VKGDR_OPEN_FORCE_NON_COHERENT_BIT : 0);
    vkgdr_share_options o;
    vkgdr_share_server_t server = NULL, stale = NULL;
    vkgdr_share_event e;
    vkgdr_share_stats stats;
    vkgdr_memory_t mem;
    vkgdr_pool_t pool;
    vkgdr_block_t blk = NULL;
    vkgdr_peer_t late = NULL, refused = NULL;
    vkgdr_attached_memory_t kept = NULL, none = NULL;
    unsigned char *buf = malloc(MEM_SIZE);
    uint64_t sent = 0, peer_id = 0;
    int asked = 0, answered = 0, gone = 0, rc;
    time_t start;
    pid_t pid;

    snprintf(path, sizeof path, "/tmp/vkgdr-share-c-%d-%d.sock", (int)getpid(), non_coherent);
    CHECK(g != NULL, "vkgdr_open_vulkan");
    if (g == NULL) {
        free(buf);
        return;
    }
    CHECK(vkgdr_share_options_init(&o, sizeof o) == VKGDR_SUCCESS && o.socket_mode == 0600 &&
              o.peers == VKGDR_SHARE_PEERS_SAME_USER && o.return_blocks == 1 && o.flags == 0,
          "option defaults");
    /* Bad options: refused before anything is bound. */
    o.flags = 1;
    CHECK(vkgdr_share_server_create(g, path, &o, &server) == VKGDR_ERROR && server == NULL,
          "flags");
    CHECK(last_error_contains("vkgdr_share_options.flags must be 0"), "explains");
    o.flags = 0;
    o.peers = VKGDR_SHARE_PEERS_UIDS;
    CHECK(vkgdr_share_server_create(g, path, &o, &server) == VKGDR_ERROR, "UIDS, no uids");
    CHECK(last_error_contains("needs uids"), "explains");
    o.peers = VKGDR_SHARE_PEERS_SAME_USER;
    o.struct_size = 0;
    CHECK(vkgdr_share_server_create(g, path, &o, &server) == VKGDR_ERROR, "unset size");
    CHECK(last_error_contains("vkgdr_share_options.struct_size is 0"), "explains");
    CHECK(vkgdr_share_server_create(NULL, path, NULL, &server) == VKGDR_ERROR, "NULL device");
    CHECK(last_error_contains("the vkgdr_t handle is NULL"), "explains");
    CHECK(vkgdr_share_server_create(g, NULL, NULL, &server) == VKGDR_ERROR, "NULL path");
    CHECK(last_error_contains("the path pointer is NULL"), "explains");
    CHECK(vkgdr_share_server_create(g, path, NULL, NULL) == VKGDR_ERROR, "NULL out");
    CHECK(last_error_contains("the server pointer is NULL"), "explains");
    vkgdr_share_options_init(&o, sizeof o);
    CHECK(vkgdr_share_server_create(g, path, &o, &server) == VKGDR_SUCCESS && server != NULL,
          "server");
    if (server == NULL) {
        vkgdr_close(g);
        free(buf);
        return;
    }

    /* What it shares: Vulkan memory of its own (no CUDA), and a pool. */
    mem = vkgdr_memory_alloc_shareable(g, MEM_SIZE, 0);
    CHECK(mem != NULL && vkgdr_memory_get_size(mem) == MEM_SIZE &&
              vkgdr_memory_get_device_ptr(mem) == 0 && vkgdr_memory_get_host_ptr(mem) != NULL,
          "shareable Vulkan memory");
    CHECK(vkgdr_memory_is_coherent(mem) == !non_coherent, "its coherence");
    CHECK(vkgdr_memory_alloc_shareable(g, 0, 0) == NULL, "zero bytes");
    CHECK(vkgdr_memory_alloc_shareable(g, 64, 1) == NULL, "flags");
    CHECK(last_error_contains("flags must be 0"), "explains");
    fill(buf, MEM_SIZE, 1);
    CHECK(vkgdr_memory_write(mem, 0, buf, MEM_SIZE) == VKGDR_SUCCESS, "the owner's pattern");
    CHECK(vkgdr_memory_write(mem, MEM_SIZE - 1, buf, 2) == VKGDR_ERROR, "write past the end");
    CHECK(vkgdr_share_memory(server, "params", mem) == VKGDR_SUCCESS, "share memory");
    pool = vkgdr_pool_create(g, NULL);
    CHECK(vkgdr_share_pool(server, "frames", pool, QUOTA) == VKGDR_SUCCESS, "share the pool");

    /* The owner's mistakes. */
    CHECK(vkgdr_share_memory(server, "params", mem) == VKGDR_ERROR, "a name taken");
    CHECK(last_error_contains("a region named \"params\" is already shared"), "explains");
    CHECK(vkgdr_share_pool(server, "", pool, 1) == VKGDR_ERROR, "an empty name");
    CHECK(last_error_contains("bad region name (empty)"), "explains");
    CHECK(vkgdr_share_memory(server, NULL, mem) == VKGDR_ERROR, "NULL name");
    CHECK(last_error_contains("vkgdr_share_memory: the name pointer is NULL"), "explains");
    CHECK(vkgdr_share_memory((vkgdr_share_server_t)pool, "x", mem) == VKGDR_ERROR,
          "a pool as the server");
    CHECK(last_error_contains("invalid vkgdr_share_server_t handle"), "explains");
    CHECK(vkgdr_share_memory(server, "x", (vkgdr_memory_t)pool) == VKGDR_ERROR,
          "a pool as memory");
    CHECK(last_error_contains("invalid vkgdr_memory_t handle"), "explains");
    CHECK(vkgdr_share_ring(server, "lanes", NULL) == VKGDR_ERROR, "NULL ring");
    CHECK(last_error_contains("vkgdr_share_ring: the vkgdr_ring_t handle is NULL"), "explains");
    CHECK(vkgdr_share_unshare(server, "nothing") == VKGDR_ERROR, "unshare what is not shared");
    CHECK(last_error_contains("nothing is shared as \"nothing\""), "explains");
    CHECK(vkgdr_share_take_returned(server, 12345, &blk) == VKGDR_SHARE_NONE && blk == NULL,
          "nothing given back yet");
    CHECK(vkgdr_share_revoke(server, 999) == VKGDR_ERROR, "revoke a peer that never was");
    CHECK(last_error_contains("no peer 999"), "explains");
    blk = vkgdr_pool_alloc(pool, 64, 64);
    CHECK(vkgdr_share_send_block(server, 999, "frames", blk, &sent) == VKGDR_ERROR,
          "send to no one");
    CHECK(last_error_contains("the block went back to its pool, unsent"), "explains");
    CHECK(vkgdr_block_get_size(blk) == 0 && last_error_contains("invalid vkgdr_block_t"),
          "the handle went with it");
    CHECK(vkgdr_share_send_block(server, 999, NULL, (vkgdr_block_t)mem, &sent) == VKGDR_ERROR,
          "NULL name");
    CHECK(vkgdr_memory_get_size(mem) == MEM_SIZE, "a refused argument takes nothing");
    e.struct_size = sizeof e;
    CHECK(vkgdr_share_next_event(server, 0, &e) == VKGDR_SHARE_NONE, "no event yet");
    e.struct_size = 0;
    CHECK(vkgdr_share_next_event(server, 0, &e) == VKGDR_ERROR, "unset event size");
    CHECK(last_error_contains("vkgdr_share_event.struct_size is 0"), "explains");
    CHECK(vkgdr_share_next_event(server, 0, NULL) == VKGDR_ERROR, "NULL event");

    /* The peer process. */
    args[0] = "share_vulkan";
    args[1] = "peer";
    args[2] = path;
    args[3] = non_coherent ? "nc" : "c";
    args[4] = NULL;
    pid = spawn_peer(args);
    CHECK(pid > 0, "fork");
    start = time(NULL);
    while (pid > 0 && !(asked && answered && gone) && time(NULL) - start < 60) {
        e.struct_size = sizeof e;
        if (vkgdr_share_next_event(server, 100000000, &e) != VKGDR_SUCCESS) {
            continue;
        }
        switch (e.kind) {
        case VKGDR_SHARE_EVENT_CONNECTED:
            CHECK(e.pid == (int32_t)pid && e.uid == (uint32_t)getuid(), "connected: pid %d",
                  e.pid);
            peer_id = e.peer;
            break;
        case VKGDR_SHARE_EVENT_ATTACHED:
            CHECK(e.peer == peer_id, "attached by the peer");
            if (strcmp(e.text, "frames") == 0) {
                /* A block sent unasked: the handle goes with it. */
                blk = vkgdr_pool_alloc(pool, 512, 64);
                fill(buf, 512, 77);
                CHECK(vkgdr_block_write(blk, 0, buf, 512) == VKGDR_SUCCESS, "tag");
                CHECK(vkgdr_share_send_block(server, e.peer, "frames", blk, &sent) ==
                          VKGDR_SUCCESS,
                      "send a block");
                CHECK(vkgdr_block_get_size(blk) == 0, "the handle was taken");
                CHECK(last_error_contains("invalid vkgdr_block_t handle"), "explains");
            }
            break;
        case VKGDR_SHARE_EVENT_RELEASED: {
            vkgdr_block_t back = NULL;
            size_t n = e.token == sent ? 512 : 100;
            CHECK(vkgdr_share_take_returned(server, e.token, &back) == VKGDR_SUCCESS &&
                      back != NULL,
                  "take block %llu back", (unsigned long long)e.token);
            CHECK(vkgdr_block_get_size(back) == n, "its size");
            memset(buf, 0, n);
            CHECK(vkgdr_block_read(back, 0, buf, n) == VKGDR_SUCCESS, "read it");
            CHECK(matches(buf, n, e.token == sent ? 78 : 10), "what the peer wrote into it");
            CHECK(vkgdr_share_take_returned(server, e.token, &blk) == VKGDR_SHARE_NONE,
                  "taken once");
            vkgdr_block_free(back);
            if (e.token == sent) {
                answered = 1;
            } else {
                asked = 1;
            }
            break;
        }
        case VKGDR_SHARE_EVENT_GONE:
            CHECK(e.peer == peer_id && e.pid == (int32_t)pid, "gone");
            gone = 1;
            break;
        case VKGDR_SHARE_EVENT_MISBEHAVED:
        case VKGDR_SHARE_EVENT_LANE_FAULT:
            CHECK(0, "event %u: %s", e.kind, e.text);
            break;
        default:
            break;
        }
    }
    CHECK(asked && answered && gone, "blocks asked for %d, answered %d, gone %d", asked,
          answered, gone);
    rc = pid > 0 ? finish_peer(pid, 60) : -1;
    CHECK(rc == 0, "the peer's checks (exit status %d)", rc);
    memset(buf, 0, MEM_SIZE);
    CHECK(vkgdr_memory_read(mem, 0, buf, MEM_SIZE) == VKGDR_SUCCESS, "read back");
    CHECK(matches(buf, MEM_SIZE, 2), "the peer's pattern, read by the owner");
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_share_get_stats(server, &stats) == VKGDR_SUCCESS && stats.connected == 1 &&
              stats.gone == 1 && stats.peers == 0 && stats.misbehaved == 0 && stats.refused == 0,
          "stats: connected %llu, gone %llu, peers %llu, misbehaved %llu",
          (unsigned long long)stats.connected, (unsigned long long)stats.gone,
          (unsigned long long)stats.peers, (unsigned long long)stats.misbehaved);

    revoke_and_refuse(server, pool, path);

    /* The server goes: a connected peer is refused, what it mapped stays readable, a new
     * connect names the missing socket; the server's handle is dead. */
    CHECK(vkgdr_peer_connect(path, 0, &late) == VKGDR_SUCCESS, "connect");
    CHECK(vkgdr_peer_attach_memory(late, "params", &kept) == VKGDR_SUCCESS, "attach");
    mark_last_error();
    vkgdr_share_server_destroy(server);
    CHECK(still_marked(), "destroy the server");
    CHECK(vkgdr_peer_attach_memory(late, "params", &none) == VKGDR_ERROR && none == NULL,
          "attach after the server is gone");
    CHECK(last_error_contains("hung up"), "explains");
    memset(buf, 0, MEM_SIZE);
    CHECK(vkgdr_attached_memory_read(kept, 0, buf, MEM_SIZE) == VKGDR_SUCCESS &&
              matches(buf, MEM_SIZE, 2),
          "what was mapped stays mapped");
    CHECK(vkgdr_peer_connect(path, 0, &refused) == VKGDR_ERROR && refused == NULL,
          "connect after the server is gone");
    CHECK(last_error_contains("connect failed (ENOENT)") && last_error_contains(path),
          "names the socket");
    CHECK(vkgdr_share_memory(server, "again", mem) == VKGDR_ERROR, "use after destroy");
    CHECK(last_error_contains("vkgdr_share_memory: invalid vkgdr_share_server_t handle"),
          "explains");
    vkgdr_share_server_destroy(server);
    CHECK(last_error_contains("vkgdr_share_server_destroy: invalid vkgdr_share_server_t"),
          "destroyed twice");
    CHECK(vkgdr_share_server_create(g, path, NULL, &stale) == VKGDR_SUCCESS,
          "the path is free again");
    vkgdr_share_server_destroy(stale);
    mark_last_error();
    vkgdr_peer_destroy(late);
    vkgdr_attached_memory_detach(kept);
    vkgdr_memory_free(mem);
    vkgdr_pool_destroy(pool);
    vkgdr_close(g);
    CHECK(still_marked(), "teardown");
    CHECK(access(path, F_OK) != 0, "the socket file is gone");
    printf("share_vulkan (%s): a peer process attached, wrote and gave blocks back\n",
           non_coherent ? "non-coherent" : "coherent");
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "peer") == 0) {
        return peer_main(argv[2], strcmp(argv[3], "nc") == 0);
    }
    run_owner(0);
    run_owner(1);
    return CHECK_SUMMARY("share_vulkan");
}
