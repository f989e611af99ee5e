// Package schema names what gpu-mem's outputs carry, for every sink alike:
// the fields of the Inspektor Gadget data sources that carry profiles
// between operators (an array per interval, one element per process, stack,
// memory kind and GPU), their stats, and the losses.
package schema

// Annotation marks such a data source, with the value "true".
const Annotation = "gpumem.profile"

// Fields of a row, and the labels of every output that has labels (pprof
// samples, Pyroscope series, metrics). Stack is the frames, outermost first, joined by ";" (the
// folded form); gpu is as memory.GPU writes it. The names fields are
// optional: operators/k8smeta adds them.
const (
	PID         = "pid"
	Comm        = "comm"
	Kind        = "kind"
	GPU         = "gpu"
	PodUID      = "pod_uid"
	ContainerID = "container_id"
	GPUUUID     = "gpu_uuid" // labels only: where the driver names the GPU
	GPUName     = "gpu_name"
	Stack       = "stack"
	AllocBytes  = "alloc_bytes"
	AllocCount  = "alloc_count"
	LiveBytes   = "live_bytes"
	LiveCount   = "live_count"

	Namespace = "namespace"
	Pod       = "pod"
	Container = "container"
	Workload  = "workload"
)

// StatsAnnotation marks the data source, emitted with each array of rows,
// that holds the totals no row carries; its fields are these and the
// loss names (Loss.String).
const StatsAnnotation = "gpumem.stats"

const (
	Events       = "events"
	UnknownFrees = "unknown_frees"
	ProcessExits = "process_exits"
	Libraries    = "libraries" // comma-separated
)
