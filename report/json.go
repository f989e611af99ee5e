package report

import (
	"encoding/json"
	"io"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

type jsonReport struct {
	Time     time.Time     `json:"time"`
	Stacks   []jsonStack   `json:"stacks"`
	Failures []jsonFailure `json:"failures"`
	OOMs     []jsonOOM     `json:"out_of_memory"`
	Peaks    []jsonPeak    `json:"peaks"`
	// Where each process's memory went on each GPU, by category.
	Breakdown []jsonBreakdown `json:"breakdown"`
	// The stacks that grew interval after interval (package growth),
	// fastest first, and when each GPU runs out at their rates.
	Growing    []jsonGrowing        `json:"growing"`
	Exhaustion []jsonExhaustion     `json:"exhaustion"`
	Losses     schema.Losses        `json:"losses"`
	Ledger     accounting.Stats     `json:"ledger"`
	Python     snapshot.PythonStats `json:"python"`
	// allocations whose native stack was deeper than the frames kept
	NativeTruncated uint64   `json:"native_truncated"`
	Events          uint64   `json:"events"`
	Libraries       []string `json:"libraries"`
	// The on-demand tensor views: from when each process's holds.
	TensorViews []snapshot.TensorView `json:"tensor_views,omitempty"`
	// DriverViewsOff: the processes whose driver view the budget switched
	// off, their driver rows partial from then on.
	DriverViewsOff []snapshot.DriverViewOff `json:"driver_views_off,omitempty"`
	// What NVML (nvidia-smi) says each GPU and process holds; null
	// (unknown) without NVML.
	GPUs []jsonGPU `json:"gpus"`
}

type jsonFrame struct {
	Function string `json:"function"`
	Module   string `json:"module,omitempty"`
	Address  uint64 `json:"address,omitempty"`
	File     string `json:"file,omitempty"`
	Line     int64  `json:"line,omitempty"`
}

// jsonWhere is where a stack's or a peak's memory is: its GPU, as the
// driver names it, and its pod and container.
type jsonWhere struct {
	GPUName     string `json:"gpu_name,omitempty"`
	GPUUUID     string `json:"gpu_uuid,omitempty"`
	GPUBus      string `json:"gpu_bus,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	Pod         string `json:"pod,omitempty"`
	Container   string `json:"container,omitempty"`
	PodUID      string `json:"pod_uid,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
}

func newJSONWhere(d gpuinfo.Device, c container.Identity) jsonWhere {
	return jsonWhere{GPUName: d.Name, GPUUUID: d.UUID, GPUBus: d.Bus,
		Namespace: c.Namespace, Pod: c.Pod, Container: c.Name, PodUID: c.PodUID, ContainerID: c.ContainerID}
}

type jsonStack struct {
	PID  uint32 `json:"pid"`
	Comm string `json:"comm"`
	Kind string `json:"kind"`
	GPU  string `json:"gpu"`
	jsonWhere
	Frames             []jsonFrame `json:"frames"` // innermost first
	AllocatedBytes     uint64      `json:"allocated_bytes"`
	Allocations        uint64      `json:"allocations"`
	FreedBytes         uint64      `json:"freed_bytes"`
	Frees              uint64      `json:"frees"`
	ImplicitFreedBytes uint64      `json:"implicit_freed_bytes"`
	ImplicitFrees      uint64      `json:"implicit_frees"`
	LiveBytes          uint64      `json:"live_bytes"`
	LiveAllocations    uint64      `json:"live_allocations"`
}

type jsonFailure struct {
	PID            uint32      `json:"pid"`
	Comm           string      `json:"comm"`
	Kind           string      `json:"kind"`
	GPU            string      `json:"gpu"`
	Function       string      `json:"function"`
	Result         int32       `json:"result"`
	Frames         []jsonFrame `json:"frames"`
	Count          uint64      `json:"count"`
	RequestedBytes uint64      `json:"requested_bytes"`
}

// jsonOOM is an out-of-memory failure and what its process held then.
type jsonOOM struct {
	Time    time.Time   `json:"time"`
	Failure jsonFailure `json:"failure"`
	Held    []jsonStack `json:"held"` // by live bytes, both views
	// Why it happened: demand, fragmentation, another_process or limit,
	// with the process's breakdown and fragmentation then.
	*jsonVerdict
}

// jsonPeak is one process's most memory at once on one GPU in one view,
// and the stacks that held it.
type jsonPeak struct {
	PID  uint32 `json:"pid"`
	Comm string `json:"comm"`
	GPU  string `json:"gpu"`
	jsonWhere
	View        string          `json:"view"` // driver or tensor
	Time        time.Time       `json:"time"`
	Bytes       uint64          `json:"bytes"`
	Allocations uint64          `json:"allocations"`
	Stacks      []jsonPeakStack `json:"stacks"` // by bytes, descending; they sum to bytes
}

// jsonPeakStack is one stack's share of a peak.
type jsonPeakStack struct {
	Kind        string      `json:"kind"`
	Frames      []jsonFrame `json:"frames"` // innermost first
	Bytes       uint64      `json:"bytes"`
	Allocations uint64      `json:"allocations"`
}

func newJSONPeak(pk snapshot.Peak) jsonPeak {
	j := jsonPeak{
		PID: pk.PID, Comm: pk.Comm, GPU: pk.GPU, jsonWhere: newJSONWhere(pk.Device, pk.Container),
		View: pk.View.String(), Time: pk.Time, Bytes: pk.Bytes, Allocations: pk.Count,
		Stacks: make([]jsonPeakStack, 0, len(pk.Rows)),
	}
	for _, row := range pk.Rows {
		j.Stacks = append(j.Stacks, jsonPeakStack{Kind: row.Kind.String(), Frames: jsonFrames(row.Frames),
			Bytes: row.LiveBytes(), Allocations: row.LiveCount()})
	}
	return j
}

func jsonFrames(frames []*symbolize.Frame) []jsonFrame {
	out := make([]jsonFrame, len(frames))
	for i, f := range frames {
		out[i] = jsonFrame{Function: f.Name(), Module: f.Module, Address: f.Address, File: f.File, Line: f.Line}
	}
	return out
}

// WriteJSON writes the whole report: every (process, stack, kind) with all
// its counters, the failed allocations, each process's peak per GPU and
// view with the stacks that held it, and the loss counters.
func WriteJSON(w io.Writer, r *snapshot.Snapshot) error {
	out := jsonReport{
		Time: r.Time, Losses: r.Losses, Ledger: r.Ledger, Python: r.Python, Events: r.Events, Libraries: r.Libraries,
		NativeTruncated: r.NativeTruncated, TensorViews: r.TensorViews, DriverViewsOff: r.DriverViewsOff, Stacks: []jsonStack{}, Failures: []jsonFailure{},
		GPUs: newJSONGPUs(r.GPUMemory),
	}
	for _, row := range r.Rows() {
		out.Stacks = append(out.Stacks, newJSONStack(row))
	}
	for _, f := range r.Failures {
		out.Failures = append(out.Failures, newJSONFailure(f))
	}
	out.OOMs = []jsonOOM{}
	for _, o := range r.OOMs {
		j := jsonOOM{Time: o.Time, Failure: newJSONFailure(o.Failure), Held: []jsonStack{}, jsonVerdict: newJSONVerdict(o.Verdict)}
		for _, row := range o.Held {
			j.Held = append(j.Held, newJSONStack(row))
		}
		out.OOMs = append(out.OOMs, j)
	}
	out.Breakdown = make([]jsonBreakdown, 0, len(r.Breakdown))
	for _, b := range r.Breakdown {
		out.Breakdown = append(out.Breakdown, newJSONBreakdown(b))
	}
	out.Growing = make([]jsonGrowing, 0, len(r.Growing))
	for _, g := range r.Growing {
		out.Growing = append(out.Growing, newJSONGrowing(g))
	}
	out.Exhaustion = make([]jsonExhaustion, 0, len(r.Exhaustion))
	for _, e := range r.Exhaustion {
		out.Exhaustion = append(out.Exhaustion, newJSONExhaustion(e))
	}
	out.Peaks = make([]jsonPeak, 0, len(r.Peaks))
	for _, pk := range r.Peaks {
		out.Peaks = append(out.Peaks, newJSONPeak(pk))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func newJSONStack(row snapshot.Row) jsonStack {
	return jsonStack{
		PID: row.PID, Comm: row.Comm, Kind: row.Kind.String(), GPU: row.GPU(), Frames: jsonFrames(row.Frames),
		jsonWhere:      newJSONWhere(row.Device, row.Container),
		AllocatedBytes: row.AllocBytes, Allocations: row.AllocCount,
		FreedBytes: row.FreeBytes, Frees: row.FreeCount,
		ImplicitFreedBytes: row.ImplicitFreeBytes, ImplicitFrees: row.ImplicitFreeCount,
		LiveBytes: row.LiveBytes(), LiveAllocations: row.LiveCount(),
	}
}

type jsonGrowing struct {
	PID  uint32 `json:"pid"`
	Comm string `json:"comm"`
	Kind string `json:"kind"`
	GPU  string `json:"gpu"`
	View string `json:"view"`
	jsonWhere
	Frames []jsonFrame `json:"frames"` // innermost first
	// LowBytes is the least the stack held in the last interval;
	// GrewBytes how much that rose over WindowSeconds.
	LowBytes       uint64    `json:"low_bytes"`
	GrewBytes      uint64    `json:"grew_bytes"`
	WindowSeconds  float64   `json:"window_seconds"`
	BytesPerSecond float64   `json:"bytes_per_second"`
	Since          time.Time `json:"since"` // growing since
}

func newJSONGrowing(g snapshot.Growing) jsonGrowing {
	return jsonGrowing{PID: g.PID, Comm: g.Comm, Kind: g.Kind.String(), GPU: g.GPU(), View: g.Kind.View().String(),
		jsonWhere: newJSONWhere(g.Device, g.Container), Frames: jsonFrames(g.Frames), LowBytes: g.Low, GrewBytes: g.Grew,
		WindowSeconds: g.Window.Seconds(), BytesPerSecond: g.BytesPerSecond, Since: g.Since}
}

type jsonExhaustion struct {
	GPU            int                   `json:"gpu"` // NVML's index
	GPUUUID        string                `json:"gpu_uuid"`
	FreeBytes      uint64                `json:"free_bytes"`
	SlackBytes     uint64                `json:"slack_bytes"` // in allocators' caches, filled first
	BytesPerSecond float64               `json:"bytes_per_second"`
	Seconds        float64               `json:"seconds"`
	Processes      []jsonExhaustionShare `json:"processes"`
}

type jsonExhaustionShare struct {
	PID            uint32  `json:"pid"`
	Comm           string  `json:"comm"`
	BytesPerSecond float64 `json:"bytes_per_second"`
	Share          float64 `json:"share"` // of the GPU's rate
}

func newJSONExhaustion(e snapshot.Exhaustion) jsonExhaustion {
	j := jsonExhaustion{GPU: e.GPU, GPUUUID: e.UUID, FreeBytes: e.Free, SlackBytes: e.Slack, BytesPerSecond: e.BytesPerSecond, Seconds: e.Seconds}
	j.Processes = make([]jsonExhaustionShare, len(e.Processes))
	for i, p := range e.Processes {
		j.Processes[i] = jsonExhaustionShare{PID: p.PID, Comm: p.Comm, BytesPerSecond: p.BytesPerSecond, Share: p.Share}
	}
	return j
}

func newJSONFailure(f snapshot.Failure) jsonFailure {
	return jsonFailure{
		PID: f.PID, Comm: f.Comm, Kind: f.Kind.String(), GPU: f.GPU(), Function: f.Op.Symbol(), Result: f.Result,
		Frames: jsonFrames(f.Frames), Count: f.Count, RequestedBytes: f.Bytes,
	}
}
