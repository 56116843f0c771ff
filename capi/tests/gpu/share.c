/* Sharing with a process that has no CUDA, on the GPU: the owner (vkgdr_open on the primary
 * context) shares raw GPU memory (vkgdr_memory_alloc_shareable) and a two-lane ring made with
 * VKGDR_RING_SHAREABLE_BIT, launches ring_consume_persistent of kernels/ring.ptx on each lane
 * (a stream each), then forks and execs this program as the peer, whose VKGDR_CUDA_LIBRARY
 * names a library that does not exist. The peer attaches the memory (reads the owner's
 * pattern, writes its own), attaches both lanes and pushes sealed test records (the format of
 * kernels/ring.cu, as gpu_ring.c makes them) into them: one record per call into one, batches
 * into the other; a third lane is refused (busy). It waits until the owner has accepted every
 * record and exits. The owner reads the peer's pattern back (the copy engine's read path), stops
 * the ring, and each lane's consumer must have seen every record once, in order, with the
 * peer's checksum sum and no error; no lane fault, nothing misbehaved.
 *
 * Usage: share path/to/kernels/ring.ptx   ("share peer PATH" is the peer it starts) */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>

#include "gpu_util.h"
#include "peer_process.h"

/* Threads per block of the checking kernels of kernels/ring.cu (RING_THREADS there). */
#define CHECK_THREADS 512
#define LANES 2
#define LANE_CAPACITY (1u << 20)
#define RECORDS 20000u
#define BATCH 8
#define MEM_SIZE (2u << 20)
#define WAIT_NS 30000000000ll

/* Payload length of record `k` of lane `lane`: 16 to ~1 KiB, every 16th one up to ~20 KiB. */
static size_t record_len(uint64_t k, uint32_t lane)
{
    if (k % 16 == 0) {
        return 4096 + (size_t)((k * 7919u + lane * 131u) % 16000u);
    }
    return 16 + (size_t)((k * 131u + lane * 17u) % 1000u);
}

#define MAX_RECORD (4096 + 16000)

/* The checksum sum of a lane's records, as the peer makes them. */
static uint64_t lane_sum(uint32_t lane, unsigned char *buf)
{
    uint64_t k, sum = 0;
    for (k = 0; k < RECORDS; k++) {
        sum += make_test_payload(buf, record_len(k, lane), k);
    }
    return sum;
}

/* --- The peer process: no CUDA ---------------------------------------------------------------- */

/* Pushes the lane's records: one per call (`batched` 0) or BATCH per call. */
static void produce(vkgdr_attached_lane_t lane, int batched, unsigned char *bufs[BATCH])
{
    uint32_t n = vkgdr_attached_lane_get_lane(lane);
    uint64_t start_tail = 99, start_seq = 99, k = 0, seq = 0, errors = 0;
    const void *ptrs[BATCH];
    size_t sizes[BATCH];
    CHECK(vkgdr_attached_lane_get_start(lane, &start_tail, &start_seq) == VKGDR_SUCCESS &&
              start_tail == 0 && start_seq == 0,
          "lane %u: a new lane starts at 0 (%llu, %llu)", n, (unsigned long long)start_tail,
          (unsigned long long)start_seq);
    while (k < RECORDS) {
        if (!batched) {
            size_t len = record_len(k, n);
            make_test_payload(bufs[0], len, k);
            errors += vkgdr_attached_lane_push(lane, bufs[0], len, WAIT_NS, &seq) != VKGDR_SUCCESS;
            errors += seq != k;
            k++;
        } else {
            size_t written = 0;
            int i, m = RECORDS - k < BATCH ? (int)(RECORDS - k) : BATCH;
            for (i = 0; i < m; i++) {
                sizes[i] = record_len(k + (unsigned)i, n);
                make_test_payload(bufs[i], sizes[i], k + (unsigned)i);
                ptrs[i] = bufs[i];
            }
            errors += vkgdr_attached_lane_push_batch(lane, ptrs, sizes, (size_t)m, WAIT_NS,
                                                     &written) != VKGDR_SUCCESS;
            errors += written != (size_t)m;
            k += (unsigned)m;
        }
        if (errors != 0) {
            break;
        }
    }
    CHECK(errors == 0, "lane %u (%s): %llu push errors", n, batched ? "batches" : "records",
          (unsigned long long)errors);
    if (errors != 0) {
        char *why = vkgdr_attached_lane_get_stop_reason(lane);
        fprintf(stderr, "  stop reason: %s\n", why ? why : "(none)");
        free(why);
    }
}

/* Waits until the owner has accepted every record of the lane (30 s at most). */
static void wait_accepted(vkgdr_attached_lane_t lane)
{
    uint64_t tail = 0, seq = 0;
    time_t start = time(NULL);
    while (time(NULL) - start < 30) {
        if (vkgdr_attached_lane_get_accepted(lane, &tail, &seq) != VKGDR_SUCCESS ||
            seq >= RECORDS) {
            break;
        }
        sleep_ms(1);
    }
    CHECK(seq == RECORDS, "lane %u: the owner accepted %llu of %u records",
          vkgdr_attached_lane_get_lane(lane), (unsigned long long)seq, RECORDS);
}

static int peer_main(const char *path)
{
    vkgdr_peer_t peer = NULL;
    vkgdr_attached_memory_t m = NULL;
    vkgdr_attached_lane_t lanes[LANES] = {NULL, NULL}, third = NULL;
    unsigned char *buf = malloc(MEM_SIZE), *bufs[BATCH];
    int i;

    CHECK(vkgdr_open(0, 0) == NULL && last_error_contains("libcuda.so.1"),
          "no CUDA in the peer");
    CHECK(vkgdr_peer_connect(path, 0, &peer) == VKGDR_SUCCESS, "connect");
    CHECK(vkgdr_peer_attach_memory(peer, "params", &m) == VKGDR_SUCCESS, "attach memory");
    CHECK(vkgdr_attached_memory_get_size(m) == MEM_SIZE, "size");
    CHECK(vkgdr_attached_memory_read(m, 0, buf, MEM_SIZE) == VKGDR_SUCCESS &&
              matches(buf, MEM_SIZE, 0x1234),
          "the owner's pattern, read by the peer");
    fill(buf, MEM_SIZE, 0xBEEF);
    CHECK(vkgdr_attached_memory_write(m, 0, buf, MEM_SIZE) == VKGDR_SUCCESS, "write");
    vkgdr_attached_memory_detach(m);

    for (i = 0; i < LANES; i++) {
        CHECK(vkgdr_peer_attach_lane(peer, "records", &lanes[i]) == VKGDR_SUCCESS,
              "attach lane %d", i);
    }
    if (lanes[0] == NULL || lanes[1] == NULL) {
        return CHECK_SUMMARY("share (peer)");
    }
    CHECK(vkgdr_attached_lane_get_lane(lanes[0]) != vkgdr_attached_lane_get_lane(lanes[1]) &&
              vkgdr_attached_lane_get_lane(lanes[0]) < LANES &&
              vkgdr_attached_lane_get_lane(lanes[1]) < LANES,
          "two lanes");
    CHECK(vkgdr_attached_lane_get_capacity(lanes[0]) == LANE_CAPACITY, "capacity");
    CHECK(!vkgdr_attached_lane_is_stopped(lanes[0]) &&
              vkgdr_attached_lane_get_stop_reason(lanes[0]) == NULL,
          "served");
    CHECK(vkgdr_peer_attach_lane(peer, "records", &third) == VKGDR_ERROR && third == NULL,
          "a third lane of two");
    CHECK(last_error_contains("busy"), "explains");

    for (i = 0; i < BATCH; i++) {
        bufs[i] = malloc(MAX_RECORD);
    }
    produce(lanes[0], 0, bufs);
    produce(lanes[1], 1, bufs);
    for (i = 0; i < LANES; i++) {
        wait_accepted(lanes[i]);
        vkgdr_attached_lane_detach(lanes[i]);
    }
    for (i = 0; i < BATCH; i++) {
        free(bufs[i]);
    }
    vkgdr_peer_destroy(peer);
    free(buf);
    return CHECK_SUMMARY("share (peer)");
}

/* --- The owner, with CUDA --------------------------------------------------------------------- */

static void run_owner(CUmodule module)
{
    char path[128], *args[4];
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    vkgdr_ring_options o;
    vkgdr_ring_device_view v;
    vkgdr_share_server_t server = NULL;
    vkgdr_share_event e;
    vkgdr_share_stats stats;
    vkgdr_memory_t mem;
    vkgdr_ring_t ring;
    CUfunction consume = NULL;
    CUstream streams[LANES];
    CUdeviceptr data[LANES], tail, stop, head, result;
    unsigned long long capacity;
    unsigned char *buf = malloc(MEM_SIZE);
    uint64_t res[8];
    void *kargs[6];
    int i, rc, gone = 0, attached = 0, busy = 0;
    time_t start;
    pid_t pid;

    snprintf(path, sizeof path, "/tmp/vkgdr-share-gpu-%d.sock", (int)getpid());
    CHECK(g != NULL, "vkgdr_open");
    CHECK(vkgdr_share_server_create(g, path, NULL, &server) == VKGDR_SUCCESS, "server");
    mem = vkgdr_memory_alloc_shareable(g, MEM_SIZE, 0);
    CHECK(mem != NULL && vkgdr_memory_get_device_ptr(mem) != 0, "shareable GPU memory");
    fill(buf, MEM_SIZE, 0x1234);
    CHECK(vkgdr_memory_write(mem, 0, buf, MEM_SIZE) == VKGDR_SUCCESS, "the owner's pattern");
    CHECK(vkgdr_share_memory(server, "params", mem) == VKGDR_SUCCESS, "share memory");
    {
        /* vkgdr_memory_alloc's small allocations are carved: refused by name. */
        vkgdr_memory_t carved = vkgdr_memory_alloc(g, 4096, 0);
        CHECK(vkgdr_share_memory(server, "carved", carved) == VKGDR_ERROR, "carved memory");
        CHECK(last_error_contains("vkgdr_memory_alloc_shareable"), "explains");
        vkgdr_memory_free(carved);
    }

    {
        /* A ring made without VKGDR_RING_SHAREABLE_BIT has no lane to lend. */
        vkgdr_ring_t plain = vkgdr_ring_create(g, 4096, 0);
        CHECK(vkgdr_share_ring(server, "plain", plain) == VKGDR_ERROR, "a plain ring");
        CHECK(last_error_contains("not made with VKGDR_RING_SHAREABLE_BIT"), "explains");
        vkgdr_ring_destroy(plain);
    }
    vkgdr_ring_options_init(&o, sizeof o);
    o.lanes = LANES;
    o.flags = VKGDR_RING_SHAREABLE_BIT;
    ring = vkgdr_ring_create_with_options(g, LANE_CAPACITY, &o);
    CHECK(ring != NULL && vkgdr_ring_get_lanes(ring) == LANES, "shareable ring");
    if (server == NULL || mem == NULL || ring == NULL) {
        free(buf);
        return;
    }
    CHECK(vkgdr_share_ring(server, "records", ring) == VKGDR_SUCCESS, "share the ring");

    /* A consumer per lane: ring_consume_persistent with the lane's addresses. */
    v.struct_size = sizeof v;
    CHECK(vkgdr_ring_get_device_view(ring, &v) == VKGDR_SUCCESS && v.lanes == LANES &&
              v.mirrored == 0,
          "view");
    CU_OK(cuMemcpyDtoH(data, v.lane_data, sizeof data));
    CU_OK(cuModuleGetFunction(&consume, module, "ring_consume_persistent"));
    capacity = v.capacity;
    stop = v.stop;
    for (i = 0; i < LANES; i++) {
        tail = v.tail + (CUdeviceptr)i * 128;
        head = v.head + (CUdeviceptr)i * 256;
        result = v.result + (CUdeviceptr)i * 256;
        CU_OK(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));
        kargs[0] = &data[i];
        kargs[1] = &capacity;
        kargs[2] = &tail;
        kargs[3] = &stop;
        kargs[4] = &head;
        kargs[5] = &result;
        CU_OK(cuLaunchKernel(consume, 1, 1, 1, CHECK_THREADS, 1, 1, 0, streams[i], kargs, NULL));
    }

    args[0] = "share";
    args[1] = "peer";
    args[2] = path;
    args[3] = NULL;
    pid = spawn_peer(args);
    CHECK(pid > 0, "fork");
    start = time(NULL);
    while (pid > 0 && !gone && time(NULL) - start < 120) {
        e.struct_size = sizeof e;
        if (vkgdr_share_next_event(server, 100000000, &e) != VKGDR_SUCCESS) {
            continue;
        }
        switch (e.kind) {
        case VKGDR_SHARE_EVENT_ATTACHED:
            attached++;
            break;
        case VKGDR_SHARE_EVENT_REQUEST_REFUSED:
            busy += strstr(e.text, "busy") != NULL;
            break;
        case VKGDR_SHARE_EVENT_LANE_FAULT:
        case VKGDR_SHARE_EVENT_MISBEHAVED:
            CHECK(0, "event %u (lane %u): %s", e.kind, e.lane, e.text);
            break;
        case VKGDR_SHARE_EVENT_GONE:
            gone = e.pid == (int32_t)pid;
            break;
        default:
            break;
        }
    }
    rc = pid > 0 ? finish_peer(pid, 60) : -1;
    CHECK(rc == 0, "the peer's checks (exit status %d)", rc);
    CHECK(gone && attached == 1 + LANES && busy == 1,
          "events: gone %d, %d attached, %d refused busy", gone, attached, busy);

    CHECK(vkgdr_ring_stop(ring) == VKGDR_SUCCESS, "stop");
    for (i = 0; i < LANES; i++) {
        CHECK(wait_stream(streams[i], 60), "lane %d: the consumer did not finish", i);
    }
    /* Read once the consumers are done: a read of this size goes through the copy engine. */
    memset(buf, 0, MEM_SIZE);
    CHECK(vkgdr_memory_read(mem, 0, buf, MEM_SIZE) == VKGDR_SUCCESS &&
              matches(buf, MEM_SIZE, 0xBEEF),
          "the peer's pattern, read by the owner");
    {
        unsigned char *rec = malloc(MAX_RECORD);
        for (i = 0; i < LANES; i++) {
            uint64_t sum = lane_sum((uint32_t)i, rec);
            memset(res, 0, sizeof res);
            CHECK(vkgdr_ring_get_lane_results(ring, (uint32_t)i, res, 5) == VKGDR_SUCCESS,
                  "lane %d: results", i);
            CHECK(res[2] == 0, "lane %d: the kernel found %llu bad records", i,
                  (unsigned long long)res[2]);
            CHECK(res[0] == RECORDS && res[3] == RECORDS,
                  "lane %d: %llu records consumed, next seq %llu, %u pushed", i,
                  (unsigned long long)res[0], (unsigned long long)res[3], RECORDS);
            CHECK(res[1] == sum, "lane %d: checksum sum differs", i);
            CHECK(vkgdr_ring_get_lane_head(ring, (uint32_t)i) == res[4], "lane %d: head", i);
        }
        free(rec);
    }
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_share_get_stats(server, &stats) == VKGDR_SUCCESS && stats.connected == 1 &&
              stats.gone == 1 && stats.lane_faults == 0 && stats.misbehaved == 0,
          "stats: connected %llu, gone %llu, lane faults %llu, misbehaved %llu",
          (unsigned long long)stats.connected, (unsigned long long)stats.gone,
          (unsigned long long)stats.lane_faults, (unsigned long long)stats.misbehaved);
    printf("share: a peer process without CUDA wrote %u MiB and pushed %u records into each of "
           "%d lanes, checked by ring_consume_persistent\n",
           MEM_SIZE >> 20, RECORDS, LANES);
    mark_last_error();
    vkgdr_share_server_destroy(server);
    for (i = 0; i < LANES; i++) {
        cuStreamDestroy(streams[i]);
    }
    vkgdr_ring_destroy(ring);
    vkgdr_memory_free(mem);
    vkgdr_close(g);
    CHECK(still_marked(), "teardown");
    free(buf);
}

int main(int argc, char **argv)
{
    char *ptx;
    CUdevice dev;
    CUmodule module;
    if (argc == 3 && strcmp(argv[1], "peer") == 0) {
        return peer_main(argv[2]);
    }
    ptx = ptx_argument(argc, argv, "ring.ptx");
    dev = enter_primary_context();
    CU_OK(cuModuleLoadData(&module, ptx));
    run_owner(module);
    cuModuleUnload(module);
    leave_primary_context(dev);
    free(ptx);
    return CHECK_SUMMARY("share");
}
