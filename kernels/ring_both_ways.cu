// The kernel of examples/ring_both_ways.rs: a persistent kernel that takes work records from CPU
// threads over a host -> device ring (include/vkgdr/ring.cuh) and sends one answer per record
// back over a device -> host ring (include/vkgdr/ring_d2h.cuh).
//
// A work record (little-endian): u32 producer, u32 index, then u32 values (the rest of the
// payload). Its answer (kind BOTH_WAYS_KIND_ANSWER, 32 bytes): u32 producer, u32 index (copied
// from the record), u32 count (values), u32 malformed (1 if the payload is not 8 + 4k bytes),
// u64 sum of the values, u64 weighted sum (sum of (i + 1) * value i, wrapping): a checksum that
// also changes when two values trade places.
//
// Block b consumes host -> device lane b with a BlockReader (thread i gets record i of each
// group) and publishes into device -> host lane b. The answers leave in the records' order: the
// warps of the block publish one after another, each with one reservation for its records
// (d2h_publish_each), so answer k of a lane is for record k of that lane. The warp call is made
// converged: after a __syncwarp of exactly the threads that call it.
//
// Per lane, in the host -> device lane's result words (pinned host memory): result[0] records
// processed, result[1] answers published, result[2] publications refused (the consumer closed
// the lane, or it stayed full for the view's spin_limit looks), result[3] malformed records,
// result[4] broken chains or a bad tail seen by the reader.
//
// Launch in.lanes blocks of 256 threads; out.lanes must be at least in.lanes, each lane of at
// least 32 slots of 64 bytes or more. Build: nvcc -ptx -arch=compute_75 -O3.

#include "../include/vkgdr/ring.cuh"
#include "../include/vkgdr/ring_d2h.cuh"

#define BOTH_WAYS_THREADS 256u
#define BOTH_WAYS_KIND_ANSWER 1u

struct Answer {
    unsigned int producer;
    unsigned int index;
    unsigned int count;
    unsigned int malformed;
    unsigned long long sum;
    unsigned long long weighted;
};

static_assert(sizeof(Answer) == 32, "Answer must match the example's Answer");

// The answer to one work record.
__device__ __forceinline__ Answer answer(const vkgdr::Record& rec)
{
    Answer a = {0u, 0u, 0u, 1u, 0ull, 0ull};
    const unsigned int* words = (const unsigned int*)rec.payload;
    if (rec.len >= 8u) {
        a.producer = __ldcg(words);
        a.index = __ldcg(words + 1);
    }
    if (rec.len < 8u || rec.len % 4u != 0u) {
        return a;
    }
    a.malformed = 0u;
    a.count = (rec.len - 8u) / 4u;
    for (unsigned int i = 0; i < a.count; ++i) {
        const unsigned long long v = __ldcg(words + 2 + i);
        a.sum += v;
        a.weighted += (unsigned long long)(i + 1u) * v;
    }
    return a;
}

extern "C" __global__ void ring_both_ways(vkgdr_ring_view in, vkgdr_d2h_view out)
{
    __shared__ vkgdr::ReaderShared<BOTH_WAYS_THREADS> smem;
    __shared__ unsigned long long scratch[BOTH_WAYS_THREADS / 32u];
    if (blockIdx.x >= in.lanes || blockIdx.x >= out.lanes || blockDim.x != BOTH_WAYS_THREADS) {
        return;
    }
    const vkgdr::RingLane lane = vkgdr::ring_lane(in, blockIdx.x);
    const vkgdr::D2hLane answers = vkgdr::d2h_lane(out, blockIdx.x);
    vkgdr::BlockReader<BOTH_WAYS_THREADS> reader(lane, smem);
    const unsigned int warp = threadIdx.x / 32u;
    unsigned long long processed = 0ull, published = 0ull, refused = 0ull, malformed = 0ull;
    unsigned long long broken = 0ull;
    while (reader.wait()) {
        vkgdr::Record rec;
        const unsigned int n = reader.next(rec); // the same in every thread
        const bool mine = threadIdx.x < n && rec.kind == VKGDR_RING_KIND_DATA;
        Answer a = {0u, 0u, 0u, 0u, 0ull, 0ull};
        if (mine) {
            a = answer(rec);
            processed += 1ull;
            malformed += a.malformed;
        }
        // The warps in turn, so the answers keep the records' order across the block.
        for (unsigned int w = 0; w * 32u < n; ++w) {
            if (warp == w) { // the whole warp: the condition is the same in each of its threads
                const unsigned int callers = __ballot_sync(0xFFFFFFFFu, mine);
                if (mine) {
                    __syncwarp(callers); // exactly the calling threads, converged
                    const int status = vkgdr::d2h_publish_each(answers, BOTH_WAYS_KIND_ANSWER, &a,
                                                               (unsigned int)sizeof(a));
                    if (status == VKGDR_D2H_OK) {
                        published += 1ull;
                    } else {
                        refused += 1ull;
                    }
                }
            }
            vkgdr::block_sync(); // this warp reserved before the next one does
        }
        if (reader.error() != VKGDR_RING_OK) {
            broken += threadIdx.x == 0 ? 1ull : 0ull;
            reader.skip_to_tail();
        }
        reader.release();
    }
    processed = vkgdr::block_sum<BOTH_WAYS_THREADS>(processed, scratch);
    published = vkgdr::block_sum<BOTH_WAYS_THREADS>(published, scratch);
    refused = vkgdr::block_sum<BOTH_WAYS_THREADS>(refused, scratch);
    malformed = vkgdr::block_sum<BOTH_WAYS_THREADS>(malformed, scratch);
    broken = vkgdr::block_sum<BOTH_WAYS_THREADS>(broken, scratch);
    if (threadIdx.x == 0) {
        lane.result[0] += processed;
        lane.result[1] += published;
        lane.result[2] += refused;
        lane.result[3] += malformed;
        lane.result[4] += broken + (reader.error() != VKGDR_RING_OK ? 1ull : 0ull);
    }
}
