// vkgdr's device-side memory ordering: acquire loads, release stores and release fences, one
// PTX instruction each, shared by ring.cuh and ring_d2h.cuh (included by them; nothing here to
// include on its own).
#ifndef VKGDR_ORDERING_CUH
#define VKGDR_ORDERING_CUH

namespace vkgdr_device {

typedef unsigned long long u64;

// Acquire loads, release and relaxed stores and release fences, one instruction each (the CPU
// is the other side at system scope). A volatile load followed by __threadfence_system()
// (fence.sc.sys) is also an acquire, but the sequentially consistent fence waits for every
// earlier memory operation of the thread to be performed system-wide (on a round trip's path:
// the last store over PCIe); an acquire load orders only what comes after it, a release store or
// fence only what came before. Needs sm_70.
__device__ __forceinline__ u64 load_acquire_sys(const volatile u64* p)
{
    u64 v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ u64 load_acquire_gpu(const volatile u64* p)
{
    u64 v;
    asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release_sys(volatile u64* p, u64 v)
{
    asm volatile("st.release.sys.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// A store the CPU may read at once, ordered with nothing: for a word that only says how far
// loads have got, once their values are in hand (a release would wait for every earlier memory
// operation of the thread, stores over PCIe included).
__device__ __forceinline__ void store_relaxed_sys(volatile u64* p, u64 v)
{
    asm volatile("st.relaxed.sys.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// This thread's earlier loads and stores before its later stores, at system scope
// (fence.acq_rel.sys: MEMBAR.ALL.SYS, not the MEMBAR.SC.SYS of __threadfence_system()).
__device__ __forceinline__ void fence_release_sys()
{
    asm volatile("fence.acq_rel.sys;" : : : "memory");
}

} // namespace vkgdr_device

#endif // VKGDR_ORDERING_CUH
