package breakdown

import (
	"os"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

func TestDefaultRulesParse(t *testing.T) {
	if _, err := Parse(strings.NewReader(defaultRules), "default.rules"); err != nil {
		t.Fatal(err)
	}
}

// Every shipped rule claims a frame made from its own conditions: none is
// shadowed by one before it with another category.
func TestEveryDefaultRuleClaims(t *testing.T) {
	rules := Default()
	for _, r := range rules.rules {
		f := &symbolize.Frame{}
		for _, c := range r.conds {
			v := strings.ReplaceAll(c.pattern, "*", "x")
			switch c.field {
			case "function":
				f.Function = v
			case "file":
				f.File = v
			case "library":
				f.Module = "/usr/lib/" + v
			case "thread":
				f.Function = memory.ThreadFrame(v)
			}
		}
		got := rules.claimOf(f, r.forTensors())
		if got == nil || got.category != r.category || got.library != r.library {
			t.Errorf("%s: a frame %+v is claimed by %+v, want %s/%s", r.where, *f, got, r.category, r.library)
		}
	}
}

func py(function, file string) *symbolize.Frame {
	return &symbolize.Frame{Function: function, File: file}
}

func native(function, module string) *symbolize.Frame {
	return &symbolize.Frame{Function: function, Module: module}
}

const site = "/usr/lib/python3/dist-packages/"

// The frames real programs show, innermost first, and their category.
func TestRealStacks(t *testing.T) {
	for _, c := range []struct {
		name   string
		frames []*symbolize.Frame
		want   string
	}{
		{"nn.Linear made on the GPU", []*symbolize.Frame{py("Linear.__init__", site+"torch/nn/modules/linear.py"), py("build", "/app/train.py")}, snapshot.Parameters},
		{"model.to(cuda)", []*symbolize.Frame{py("Module._apply", site+"torch/nn/modules/module.py"), py("Module.to", site+"torch/nn/modules/module.py"), py("main", "/app/train.py")}, snapshot.Parameters},
		{"Llama built", []*symbolize.Frame{py("LlamaRotaryEmbedding.__init__", site+"transformers/models/llama/modeling_llama.py"), py("LlamaModel.__init__", site+"transformers/models/llama/modeling_llama.py")}, snapshot.Parameters},
		{"from_pretrained", []*symbolize.Frame{py("_load_state_dict_into_meta_model", site+"transformers/modeling_utils.py"), py("PreTrainedModel.from_pretrained", site+"transformers/modeling_utils.py")}, snapshot.Parameters},
		{"forward", []*symbolize.Frame{py("LlamaMLP.forward", site+"transformers/models/llama/modeling_llama.py"), py("Module._call_impl", site+"torch/nn/modules/module.py"), py("step", "/app/train.py")}, snapshot.Activations},
		{"a forward op's native stack", []*symbolize.Frame{native("at::native::empty_cuda", "/usr/lib/libtorch_cuda.so"),
			native("torch::autograd::VariableType::(anonymous namespace)::mm", "/usr/lib/libtorch_cpu.so"),
			py("LlamaMLP.forward", site+"transformers/models/llama/modeling_llama.py")}, snapshot.Activations},
		{"a backward op's native stack", []*symbolize.Frame{native("at::native::empty_cuda", "/usr/lib/libtorch_cuda.so"),
			native("torch::autograd::VariableType::(anonymous namespace)::mm", "/usr/lib/libtorch_cpu.so"),
			native("torch::autograd::generated::MmBackward0::apply", "/usr/lib/libtorch_cpu.so"),
			native("torch::autograd::Engine::evaluate_function", "/usr/lib/libtorch_cpu.so")}, snapshot.Gradients},
		// as an H100 showed it: libtorch's frames end where its frame pointers do
		{"a backward on autograd's thread", []*symbolize.Frame{native("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate", "/usr/lib/libc10_cuda.so"),
			native("at::detail::empty_generic", "/usr/lib/libtorch_cpu.so"), native("at::detail::empty_cuda", "/usr/lib/libtorch_cuda.so"),
			{Function: memory.ThreadFrame("pt_autograd_0")}}, snapshot.Gradients},
		{"cuBLAS's workspace on autograd's thread", []*symbolize.Frame{native("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate", "/usr/lib/libc10_cuda.so"),
			native("at::cuda::setWorkspaceForHandle", "/usr/lib/libtorch_cuda.so"), {Function: memory.ThreadFrame("pt_autograd_0")}}, snapshot.Activations},
		{"backward", []*symbolize.Frame{py("_engine_run_backward", site+"torch/autograd/graph.py"), py("backward", site+"torch/autograd/__init__.py"), py("Tensor.backward", site+"torch/_tensor.py"), py("step", "/app/train.py")}, snapshot.Gradients},
		{"AdamW's state", []*symbolize.Frame{py("AdamW._init_group", site+"torch/optim/adamw.py"), py("AdamW.step", site+"torch/optim/adamw.py"), py("step", "/app/train.py")}, snapshot.OptimizerState},
		{"a static cache", []*symbolize.Frame{py("StaticLayer.lazy_initialization", site+"transformers/cache_utils.py"), py("StaticCache.__init__", site+"transformers/cache_utils.py"), py("GenerationMixin.generate", site+"transformers/generation/utils.py")}, snapshot.KVCache},
		{"vLLM's KV cache", []*symbolize.Frame{py("GPUModelRunner._allocate_kv_cache_tensors", "/opt/vllm/vllm/v1/worker/gpu_model_runner.py"), py("GPUModelRunner.initialize_kv_cache", "/opt/vllm/vllm/v1/worker/gpu_model_runner.py")}, snapshot.KVCache},
		{"vLLM's weights", []*symbolize.Frame{py("LlamaForCausalLM.load_weights", "/opt/vllm/vllm/model_executor/models/llama.py"), py("GPUModelRunner.load_model", "/opt/vllm/vllm/v1/worker/gpu_model_runner.py")}, snapshot.Parameters},
	} {
		if got := Default().Categorizer().tensorCategory(c.frames); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

func TestDriverStacks(t *testing.T) {
	st := Default().Categorizer()
	for _, c := range []struct {
		frames       []*symbolize.Frame
		cat, library string
	}{
		{[]*symbolize.Frame{native("cudaMalloc", "/usr/lib/libcudart.so.13"), native("cublasLtMatmul", "/usr/lib/libcublasLt.so.13.0.1")}, snapshot.LibraryWorkspaces, "cublasLt"},
		{[]*symbolize.Frame{native("", "/usr/lib/libcublas.so.13")}, snapshot.LibraryWorkspaces, "cublas"},
		{[]*symbolize.Frame{native("ncclCommInitRank", "/opt/nccl/lib/libnccl.so.2")}, snapshot.LibraryWorkspaces, "nccl"},
		{[]*symbolize.Frame{native("", "/usr/lib/libcudart.so.13"), native("f", "/opt/lib/libcustom.so.1"), native("g", "/usr/lib/libcublas.so.13")}, snapshot.LibraryWorkspaces, "cublas"},
		{[]*symbolize.Frame{native("", "/usr/lib/libcuda.so.1"), native("f", "/opt/lib/libcustom.so.1"), native("g", "/usr/lib/libother.so.1")}, snapshot.LibraryWorkspaces, "libcustom"},
		{[]*symbolize.Frame{native("", "/usr/lib/libcudart.so.13"), native("f", "/opt/lib/libcustom.so.1")}, snapshot.LibraryWorkspaces, "libcustom"},
		{[]*symbolize.Frame{native("main", "/usr/bin/simwork"), py("f", "/app/x.py")}, snapshot.OtherDriver, ""},
		{[]*symbolize.Frame{native("", "/usr/lib/libcuda.so.1"), native("ffi_call", "/usr/lib/libffi.so.8"), native("", "/usr/lib/libcustom.so")}, snapshot.OtherDriver, ""},
	} {
		cat, lib := st.driverCategory(c.frames)
		if cat != c.cat || lib != c.library {
			t.Errorf("%v: %s/%s, want %s/%s", c.frames[len(c.frames)-1], cat, lib, c.cat, c.library)
		}
	}
}

func TestBadRulesRefused(t *testing.T) {
	for _, c := range []struct{ text, err string }{
		{"weights function=f", `breakdown rules: r:1: unknown category "weights"`},
		{"# ok\n\nparameters", "breakdown rules: r:3: parameters: no condition"},
		{"parameters func=f", `breakdown rules: r:1: condition "func=f": want function=, file=, library= or thread=<pattern>`},
		{"parameters function=", `breakdown rules: r:1: condition "function="`},
		{"library_workspaces library=libx.so", "breakdown rules: r:1: library_workspaces needs a library after a slash"},
		{"kv_cache/x function=f", `breakdown rules: r:1: kv_cache takes no library: "kv_cache/x"`},
	} {
		_, err := Parse(strings.NewReader(c.text), "r")
		if err == nil || !strings.HasPrefix(err.Error(), c.err) {
			t.Errorf("%q: %v, want %s...", c.text, err, c.err)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"a", "a", true}, {"a", "ab", false}, {"*", "", true}, {"a*", "abc", true}, {"*c", "abc", true},
		{"a*c", "ac", true}, {"a*b*c", "abc", true}, {"ab*ba", "aba", false}, {"*/torch/*", "/x/torch/y.py", true},
		{"*.__init__", "Linear.__init__", true}, {"*.__init__", "__init__", false}, {"lib*.so*", "libnccl.so.2", true},
	} {
		if got := match(c.pattern, c.s); got != c.want {
			t.Errorf("match(%q, %q) = %v", c.pattern, c.s, got)
		}
	}
}

func TestUserRulesComeFirst(t *testing.T) {
	path := t.TempDir() + "/my.rules"
	if err := os.WriteFile(path, []byte("kv_cache function=Trainer.cache_outputs\nactivations function=*.reset_parameters\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rules, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	st := rules.Categorizer()
	if got := st.tensorCategory([]*symbolize.Frame{py("Linear.reset_parameters", site+"torch/nn/modules/linear.py")}); got != snapshot.Activations {
		t.Errorf("a user's rule on the same frame: %s, want activations", got)
	}
	if got := st.tensorCategory([]*symbolize.Frame{py("f", "/app/t.py"), py("Trainer.cache_outputs", "/app/t.py")}); got != snapshot.KVCache {
		t.Errorf("a user's rule: %s, want kv_cache", got)
	}
	if _, err := Load(t.TempDir() + "/none"); err == nil || !strings.Contains(err.Error(), "breakdown rules: open") {
		t.Errorf("a missing file: %v", err)
	}
}
