# How the CPU kernels spread their work over threads. A kernel describes its work as a ChunkTask (independent
# items 0..n-1: rows, tokens, chunks); a Runner chooses the threads that run the items.
#   MojoThreads: Mojo's runtime (`parallelize`), what a MAX graph uses; its workers are awake during a graph.
#   OpenMP: the OpenMP runtime of the calling process (torch's, for bindings/eager_cpu.mojo): its workers spin
#     for a while after each parallel region, so calls from torch do not wait for sleeping threads to wake up
#     (hundreds of µs on a VM), and torch's ops and ours share one pool instead of competing for the cores.
from max.algorithm import parallelize
from std.atomic import Atomic

comptime _VoidPtr = OpaquePointer[MutAnyOrigin]
comptime _OmpBody = def(_VoidPtr) abi("C") thin -> None
comptime _GompParallel = def(_OmpBody, _VoidPtr, UInt32, UInt32) abi("C") thin -> None
"""libgomp's `GOMP_parallel(fn, data, num_threads, flags)`, the entry point of `#pragma omp parallel` (LLVM's
and Intel's OpenMP runtimes export it too). num_threads 0: the calling thread's OpenMP default, which
torch.set_num_threads sets."""


trait ChunkTask(ImplicitlyCopyable, Movable, Deinitable):
    def run(self, item: Int):
        ...


trait Runner:
    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        """Runs task.run(i) for every i in [0, items): on this thread alone when `serial`."""
        ...


struct MojoThreads(Runner):
    def __init__(out self):
        pass

    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        if serial or items == 1:
            for i in range(items):
                task.run(i)
        else:
            def item(i: Int) {var task}:
                task.run(i)

            parallelize(item, items)


comptime _OMP_BLOCKS = 64
"""The OpenMP team takes the items in about this many blocks: enough to balance uneven items, few enough that
the threads rarely meet on the shared counter (one increment per item was 2x slower for 0.1 µs rows)."""


struct _OmpJob[T: ChunkTask]:
    var task: Self.T
    var items: Int
    var block: Int
    var next: Atomic[Int64]

    def __init__(out self, task: Self.T, items: Int):
        self.task = task
        self.items = items
        self.block = max(1, items // _OMP_BLOCKS)
        self.next = Atomic[Int64](0)


def _omp_body[T: ChunkTask](data: _VoidPtr) abi("C"):
    """Every thread of the OpenMP team takes blocks of items until none is left."""
    var job = data.unsafe_bitcast[_OmpJob[T]]()
    var items, block = job[].items, job[].block
    while True:
        var start = Int(job[].next.fetch_add(Int64(block)))
        if start >= items:
            return
        for i in range(start, min(start + block, items)):
            job[].task.run(i)


struct OpenMP(Runner):
    var gomp_parallel: Int
    """The address of GOMP_parallel in the process (bindings/library.py finds it); 0: none, use MojoThreads."""

    def __init__(out self, gomp_parallel: Int):
        self.gomp_parallel = gomp_parallel

    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        if self.gomp_parallel == 0:
            MojoThreads().run(task, items, serial)
        elif serial or items == 1:
            for i in range(items):
                task.run(i)
        else:
            var job = _OmpJob[T](task, items)
            var address = self.gomp_parallel
            var gomp_parallel = Pointer(to=address).unsafe_bitcast[_GompParallel]()[]
            var body: _OmpBody = _omp_body[T]
            gomp_parallel(body, Pointer(to=job).unsafe_bitcast[NoneType]().unsafe_origin_cast[MutAnyOrigin](), 0, 0)
            _ = job^  # GOMP_parallel returns when every thread is done with it
