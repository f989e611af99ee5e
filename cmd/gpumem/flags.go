package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/nvml"
	"github.com/gpu-mem/gpu-mem/profiler"
)

// targetFlags are the flags that say what to trace, shared by every command.
type targetFlags struct {
	pids    []int
	gpus    []int
	library string
	tensors tensorScope
	// tensorNative walks tensors' whole native stacks.
	tensorNative bool
	nvml         string // the NVIDIA management library read
	rules        rulesFile
	stateDir     string // the journal's directory; none: no state kept
	pinPath      string // where maps and probes are pinned
}

// register adds the flags; tensors is the command's default scope of the
// tensor view.
func (t *targetFlags) register(fs *pflag.FlagSet, tensors profiler.TensorScope) {
	t.tensors = tensorScope(tensors)
	fs.IntSliceVar(&t.pids, "pid", nil, "trace only these processes (repeat or comma-separate)")
	fs.IntSliceVar(&t.gpus, "gpu", nil, "show only memory on these device ordinals (repeat or comma-separate)")
	fs.StringVar(&t.library, "library", "", "attach to this driver library only and trace the processes that map it, instead of finding every libcuda.so* mapped by a process")
	fs.Var(&t.tensors, "tensors", "the tensor view (PyTorch's caching allocator, libc10_cuda.so): all (every process; --tensors alone), on-demand (the processes switched on; the agent), or off")
	fs.Lookup("tensors").NoOptDefVal = "all"
	fs.BoolVar(&t.tensorNative, "tensor-native-stacks", false, "walk the whole native stack (ATen, bindings) of tensors allocated from Python, not only the allocator's frame")
	fs.Var(&t.rules, "breakdown-rules", "a file of rules sorting stacks into the breakdown's categories, read before the shipped ones (docs/breakdown.md)")
	fs.StringVar(&t.stateDir, "state-dir", "", "keep the state here on the host (a journal of what was read), and continue the state an agent left there: "+
		"the books of what processes hold go on across restarts, rollouts and upgrades (docs/agent-and-kubernetes.md); none: every start is afresh")
	fs.StringVar(&t.pinPath, "pin-path", "/sys/fs/bpf/gpu-mem", "with --state-dir: pin the maps and probes here, on a BPF file system")
	fs.StringVar(&t.nvml, "nvml-library", nvml.Library, "the NVIDIA driver's management library, read for what nvidia-smi shows per GPU and process (contexts, kernel images, driver internals, untraced processes): a path, or a name the dynamic loader finds; empty: not read")
}

func (t *targetFlags) config() profiler.Config {
	cfg := profiler.Config{PIDs: t.pids, GPUs: t.gpus, Library: t.library, Tensors: profiler.TensorScope(t.tensors),
		TensorNativeStacks: t.tensorNative, NVML: t.nvml, Log: log}
	if t.stateDir != "" {
		cfg.StateDir, cfg.PinPath = t.stateDir, t.pinPath
	}
	return cfg
}

// tensorScope is --tensors: all, on-demand or off (true and false are all
// and off).
type tensorScope profiler.TensorScope

var tensorScopes = map[string]profiler.TensorScope{
	"all": profiler.TensorsAll, "true": profiler.TensorsAll,
	"on-demand": profiler.TensorsOnDemand,
	"off":       profiler.TensorsOff, "false": profiler.TensorsOff,
}

func (s *tensorScope) String() string {
	return map[profiler.TensorScope]string{profiler.TensorsAll: "all", profiler.TensorsOnDemand: "on-demand", profiler.TensorsOff: "off"}[profiler.TensorScope(*s)]
}

func (s *tensorScope) Set(v string) error {
	scope, ok := tensorScopes[v]
	if !ok {
		return fmt.Errorf("want all, on-demand or off, got %q", v)
	}
	*s = tensorScope(scope)
	return nil
}

func (*tensorScope) Type() string { return "scope" }

// rulesFile is --breakdown-rules: a user's rules, read (and refused, with
// the line and why) when the flag is parsed.
type rulesFile struct {
	path  string
	rules *breakdown.Rules
}

func (r *rulesFile) String() string { return r.path }

func (r *rulesFile) Set(path string) error {
	rules, err := breakdown.Load(path)
	if err != nil {
		return err
	}
	r.path, r.rules = path, rules
	return nil
}

func (*rulesFile) Type() string { return "file" }

// get are the rules: the user's and the shipped ones, or the shipped ones.
func (r *rulesFile) get() *breakdown.Rules {
	if r.rules == nil {
		return breakdown.Default()
	}
	return r.rules
}

// flagGroup is the annotation that puts a flag under a heading of its
// command's help and reference page, as kubectl groups its flags: a
// command with many flags reads as a few sets, each named for the
// system it talks to.
const flagGroup = "gpumem_flag_group"

// groupFlags puts the named flags of fs under heading.
func groupFlags(fs *pflag.FlagSet, heading string, names ...string) {
	for _, name := range names {
		if err := fs.SetAnnotation(name, flagGroup, []string{heading}); err != nil {
			panic(fmt.Sprintf("flag group %s: %v", heading, err)) // a name misspelt here
		}
	}
}

// flagSection is one heading of a command's flags and their usage.
type flagSection struct {
	Heading, Usages string
}

// flagSections parts fs's flags by group: those of none first, under
// "Flags", then each group's, by heading. Hidden flags are left out.
func flagSections(fs *pflag.FlagSet) []flagSection {
	ungrouped := pflag.NewFlagSet("", pflag.ContinueOnError)
	groups := map[string]*pflag.FlagSet{}
	fs.VisitAll(func(f *pflag.Flag) {
		g := f.Annotations[flagGroup]
		if len(g) == 0 {
			ungrouped.AddFlag(f)
			return
		}
		if groups[g[0]] == nil {
			groups[g[0]] = pflag.NewFlagSet(g[0], pflag.ContinueOnError)
		}
		groups[g[0]].AddFlag(f)
	})
	sections := []flagSection{{"Flags", ungrouped.FlagUsages()}}
	for _, heading := range slices.Sorted(maps.Keys(groups)) {
		sections = append(sections, flagSection{heading + " flags", groups[heading].FlagUsages()})
	}
	return sections
}

// flatFlags is where cobra's usage template prints a command's flags, in
// one list.
const flatFlags = "Flags:\n{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}"

// groupUsage has cmd's help print its flags by group (flagSections).
func groupUsage(cmd *cobra.Command) {
	cobra.AddTemplateFunc("flagSections", flagSections)
	tmpl := cmd.UsageTemplate()
	if !strings.Contains(tmpl, flatFlags) {
		panic("cobra's usage template prints flags otherwise: update flatFlags")
	}
	cmd.SetUsageTemplate(strings.Replace(tmpl, flatFlags, `{{range $i, $s := flagSections .LocalFlags}}{{if $i}}

{{end}}{{$s.Heading}}:
{{$s.Usages | trimTrailingWhitespaces}}{{end}}`, 1))
}
