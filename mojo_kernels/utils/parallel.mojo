# How the CPU kernels spread their work over threads. A kernel describes its work as a ChunkTask (independent
# items 0..n-1: rows, tokens, chunks); a Runner chooses the threads that run the items.
#   MojoThreads: Mojo's runtime (`parallelize`), what a MAX graph uses; its workers are awake during a graph.
#   OpenMP: the OpenMP runtime of the calling process (torch's, for bindings/eager_cpu.mojo): its workers spin
#     for a while after each parallel region, so calls from torch do not wait for sleeping threads to wake up
#     (hundreds of µs on a VM), and torch's ops and ours share one pool instead of competing for the cores.
from max.algorithm import parallelize
from max.runtime.asyncrt import parallelism_level
from std.atomic import Atomic
from max.gpu.host import DeviceContext
from max.gpu.host.device_context import DeviceContextBase
from std.sys import CompilationTarget

comptime _VoidPtr = OpaquePointer[MutAnyOrigin]
comptime _OmpBody = def(_VoidPtr) abi("C") thin -> None
comptime _GompParallel = def(_OmpBody, _VoidPtr, UInt32, UInt32) abi("C") thin -> None
"""libgomp's `GOMP_parallel(fn, data, num_threads, flags)`, the entry point of `#pragma omp parallel` (LLVM's
and Intel's OpenMP runtimes export it too). num_threads 0: the calling thread's OpenMP default, which
torch.set_num_threads sets."""
comptime _OmpInt = def() abi("C") thin -> Int32
"""omp_get_thread_num / omp_get_num_threads."""


trait ChunkTask(ImplicitlyCopyable, Movable, Deinitable):
    def run(self, item: Int):
        ...


trait Runner:
    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        """Runs task.run(i) for every i in [0, items): on this thread alone when `serial`."""
        ...


def _on_this_thread[T: ChunkTask](task: T, items: Int):
    for i in range(items):
        task.run(i)


comptime CHUNKS_PER_WORKER = 8
comptime CpuContext = DeviceContextBase[CompilationTarget()]
"""The type of context `parallelize` takes: a graph op's DeviceContext on the CPU."""


struct MojoThreads(Runner):
    var ctx: Optional[CpuContext]
    """The op's context: without one, every `parallelize` makes a DeviceContext of its own."""

    def __init__(out self):
        self.ctx = None

    def __init__(out self, ctx: DeviceContext):
        self.ctx = rebind[CpuContext](ctx)

    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        """Contiguous chunks handed out in turn, CHUNKS_PER_WORKER per worker: a worker slowed down (by the
        previous op, or another process) takes fewer, instead of the op waiting for its fixed share."""
        if serial or items == 1:
            _on_this_thread(task, items)
            return
        var workers = parallelism_level(self.ctx)
        var chunks = min(items, workers * CHUNKS_PER_WORKER)
        var taken = List[Int64](length=1, fill=0)
        var counter = Int(taken.unsafe_ptr())

        def worker(w: Int) {var task, var counter, var chunks, var items}:
            var next = Pointer[Atomic[Int64], MutAnyOrigin](unsafe_from_address=counter)
            while True:
                var c = Int(next[].fetch_add(1))
                if c >= chunks:
                    return
                for i in range(c * items // chunks, (c + 1) * items // chunks):
                    task.run(i)

        parallelize(worker, workers, workers, self.ctx)
        _ = taken^


struct OpenMPEntryPoints:
    """The OpenMP runtime's functions the runner calls: three addresses in a row in memory
    (bindings/library.py openmp_entry_points)."""

    var gomp_parallel: _GompParallel
    var thread_num: _OmpInt
    var num_threads: _OmpInt


struct _OmpJob[T: ChunkTask]:
    var task: Self.T
    var items: Int
    var openmp: Pointer[OpenMPEntryPoints, MutUntrackedOrigin]

    def __init__(out self, task: Self.T, items: Int, openmp: Pointer[OpenMPEntryPoints, MutUntrackedOrigin]):
        self.task = task
        self.items = items
        self.openmp = openmp


def _omp_body[T: ChunkTask](data: _VoidPtr) abi("C"):
    """Thread t of the team's T runs the t-th of T contiguous ranges of items, as torch's at::parallel_for
    does: one stream through memory per thread (handing out 16K-element chunks in turn was 10% slower)."""
    var job = data.unsafe_bitcast[_OmpJob[T]]()
    var t = Int(job[].openmp[].thread_num())
    var threads = Int(job[].openmp[].num_threads())
    var items = job[].items
    for i in range(t * items // threads, (t + 1) * items // threads):
        job[].task.run(i)


struct OpenMP(Runner):
    var entry_points: Int
    """The address of the process's OpenMPEntryPoints (bindings/library.py finds them); 0: none, use MojoThreads."""

    def __init__(out self, entry_points: Int):
        self.entry_points = entry_points

    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        if self.entry_points == 0:
            MojoThreads().run(task, items, serial)
        elif serial or items == 1:
            _on_this_thread(task, items)
        else:
            var openmp = Pointer[OpenMPEntryPoints, MutUntrackedOrigin](unsafe_from_address=self.entry_points)
            var job = _OmpJob[T](task, items, openmp)
            var body: _OmpBody = _omp_body[T]
            openmp[].gomp_parallel(body, Pointer(to=job).unsafe_bitcast[NoneType]().unsafe_origin_cast[MutAnyOrigin](), 0, 0)
            _ = job^  # GOMP_parallel returns when every thread is done with it
