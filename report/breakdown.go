package report

import (
	"fmt"
	"io"
	"strings"

	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// jsonBreakdown is where one process's memory went on one GPU.
type jsonBreakdown struct {
	PID  uint32 `json:"pid"`
	Comm string `json:"comm"`
	GPU  string `json:"gpu"`
	jsonWhere
	Bytes uint64 `json:"bytes"` // the parts' sum: NVML's number for it, with nvml
	// NVML says the parts hold NVML's number (contexts, modules, driver
	// internals among them); else they are the driver view.
	NVML bool `json:"nvml"`
	// TensorView: without it, the allocator's segments are one part,
	// allocator_segments.
	TensorView    bool               `json:"tensor_view"`
	Categories    []jsonPart         `json:"categories"` // by bytes, descending
	Fragmentation *jsonFragmentation `json:"fragmentation"`
}

type jsonPart struct {
	Category  string          `json:"category"`
	Library   string          `json:"library,omitempty"` // library_workspaces': which
	Bytes     uint64          `json:"bytes"`
	TopStacks []jsonPeakStack `json:"top_stacks"`
}

type jsonFragmentation struct {
	FreeInSegments   uint64 `json:"free_in_segments_bytes"`
	LargestFreeBlock uint64 `json:"largest_free_block_bytes"`
}

// jsonVerdict is why an out-of-memory happened.
type jsonVerdict struct {
	Verdict       string             `json:"verdict"`
	Why           string             `json:"why"`
	Asked         uint64             `json:"asked_bytes"`
	Fragmentation *jsonFragmentation `json:"fragmentation"`
	Breakdown     jsonBreakdown      `json:"breakdown"`
	FreeOnGPU     uint64             `json:"free_on_gpu_bytes"`
	Neighbours    []jsonNeighbour    `json:"neighbours"`
}

type jsonNeighbour struct {
	PID   uint32 `json:"pid"`
	Comm  string `json:"comm"`
	Bytes uint64 `json:"bytes"`
	jsonWhere
}

func newJSONBreakdown(b snapshot.Breakdown) jsonBreakdown {
	j := jsonBreakdown{PID: b.PID, Comm: b.Comm, GPU: b.GPU, jsonWhere: newJSONWhere(b.Device, b.Container),
		Bytes: b.Bytes(), NVML: b.NVML, TensorView: b.TensorView, Categories: []jsonPart{},
		Fragmentation: newJSONFragmentation(b.Fragmentation)}
	for _, p := range b.Parts {
		part := jsonPart{Category: p.Category, Library: p.Library, Bytes: p.Bytes, TopStacks: []jsonPeakStack{}}
		for _, h := range p.Top {
			part.TopStacks = append(part.TopStacks, jsonPeakStack{Kind: h.Kind.String(), Frames: jsonFrames(h.Frames), Bytes: h.Bytes})
		}
		j.Categories = append(j.Categories, part)
	}
	return j
}

func newJSONFragmentation(f *snapshot.Fragmentation) *jsonFragmentation {
	if f == nil {
		return nil
	}
	return &jsonFragmentation{FreeInSegments: f.FreeInSegments, LargestFreeBlock: f.LargestFreeBlock}
}

func newJSONVerdict(v *snapshot.Verdict) *jsonVerdict {
	if v == nil {
		return nil
	}
	j := &jsonVerdict{Verdict: v.Verdict, Why: v.Why, Asked: v.Asked, Fragmentation: newJSONFragmentation(v.Fragmentation),
		Breakdown: newJSONBreakdown(v.Breakdown), FreeOnGPU: v.Free, Neighbours: []jsonNeighbour{}}
	for _, n := range v.Neighbours {
		j.Neighbours = append(j.Neighbours, jsonNeighbour{PID: n.PID, Comm: n.Comm, Bytes: n.NVML, jsonWhere: newJSONWhere(gpuinfo.Device{}, n.Container)})
	}
	return j
}

// BreakdownLine is one process's breakdown on one GPU in one line, its
// categories largest first: top's header, record's summary.
func BreakdownLine(b snapshot.Breakdown) string {
	parts := make([]string, 0, len(b.Parts))
	for _, p := range b.Parts {
		parts = append(parts, p.Name()+" "+HumanBytes(p.Bytes))
	}
	of := "driver view"
	if b.NVML {
		of = "nvidia-smi"
	}
	line := fmt.Sprintf("pid %d (%s) gpu %s: %s (%s): %s", b.PID, b.Comm, b.GPU, HumanBytes(b.Bytes()), of, strings.Join(parts, ", "))
	if f := b.Fragmentation; f != nil {
		line += fmt.Sprintf("; free in segments %s, largest block %s", HumanBytes(f.FreeInSegments), HumanBytes(f.LargestFreeBlock))
	}
	return line
}

// writeBreakdowns writes a line per process and GPU.
func writeBreakdowns(w io.Writer, bs []snapshot.Breakdown) {
	for _, b := range bs {
		fmt.Fprintln(w, BreakdownLine(b))
	}
}
