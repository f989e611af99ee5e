package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gpu-mem/gpu-mem/gadgetyaml"
	"github.com/gpu-mem/gpu-mem/logs"
)

// The image tests build the repository's gadget into IG's local image
// store (/var/lib/ig/oci-store, as ig does) under a tag of their own, and
// remove it when done.

var (
	imageOnce sync.Once
	imageTag  string
	imageErr  error
)

// gadgetImage builds the gadget once for all the tests that need it.
func gadgetImage(t *testing.T) string {
	t.Helper()
	imageOnce.Do(func() {
		imageTag = fmt.Sprintf("gpumem-test:%d", os.Getpid())
		out, err := exec.Command(gpumem, "image", "build", "-t", imageTag, repoRoot).CombinedOutput()
		if err != nil {
			imageErr = fmt.Errorf("gpumem image build: %v\n%s", err, out)
		}
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return imageTag
}

// removeImage removes what gadgetImage built; TestMain calls it.
func removeImage() {
	if imageTag != "" {
		exec.Command(gpumem, "image", "remove", imageTag).Run()
	}
}

// imageDigest is the digest gpumem image list shows for tag.
func imageDigest(t *testing.T, tag string) string {
	t.Helper()
	out, err := exec.Command(gpumem, "image", "list", "--no-trunc").CombinedOutput()
	if err != nil {
		t.Fatalf("gpumem image list: %v\n%s", err, out)
	}
	repo, version, _ := strings.Cut(tag, ":")
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == repo && f[1] == version {
			return f[2]
		}
	}
	return ""
}

func gpumemImage(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(gpumem, append([]string{"image"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("gpumem image %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestImageExportImport exports the image to a tarball, removes it, and
// imports it back: the same digest.
func TestImageExportImport(t *testing.T) {
	tag := gadgetImage(t)
	digest := imageDigest(t, tag)
	if !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("image list shows %q for %s", digest, tag)
	}
	tarball := filepath.Join(t.TempDir(), "gpu-mem.tar")
	gpumemImage(t, "export", tag, tarball)
	if st, err := os.Stat(tarball); err != nil || st.Size() == 0 {
		t.Fatalf("export wrote nothing: %v", err)
	}
	gpumemImage(t, "remove", tag)
	if d := imageDigest(t, tag); d != "" {
		t.Fatalf("%s still listed after remove", tag)
	}
	gpumemImage(t, "import", tarball)
	if d := imageDigest(t, tag); d != digest {
		t.Fatalf("imported digest %q, exported %q", d, digest)
	}
}

// TestIGRuntimeReadsImage has IG's own runtime, with IG's eBPF operator,
// load the image and report its data sources and fields; they must be what
// gadget.yaml declares, annotations included. It runs in a private PID
// namespace: IG reads /proc/1, which this machine does not let it read.
func TestIGRuntimeReadsImage(t *testing.T) {
	tag := gadgetImage(t)
	iginfo := filepath.Join(t.TempDir(), "iginfo")
	if out, err := exec.Command("go", "build", "-o", iginfo, "./iginfo").CombinedOutput(); err != nil {
		t.Fatalf("build iginfo: %v\n%s", err, out)
	}
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", iginfo, tag)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("iginfo: %v", err)
	}
	var got map[string]struct {
		Annotations map[string]string
		Fields      map[string]map[string]string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("iginfo output: %v\n%s", err, out)
	}
	m, err := gadgetyaml.Read(filepath.Join(repoRoot, "gadget.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(m.DataSources) {
		t.Errorf("IG reports %d data sources, gadget.yaml declares %d", len(got), len(m.DataSources))
	}
	for name, want := range m.DataSources {
		ds, ok := got[name]
		if !ok {
			t.Errorf("IG reports no data source %s", name)
			continue
		}
		for k, v := range want.Annotations {
			if ds.Annotations[k] != v {
				t.Errorf("%s: annotation %s=%q, gadget.yaml says %q", name, k, ds.Annotations[k], v)
			}
		}
		for field, f := range want.Fields {
			if top, _, _ := strings.Cut(field, "."); top == "k8s" || top == "runtime" {
				continue // added by IG's enrichment, which iginfo does not run: TestStockIGDashboardMetrics (tracer) adds them
			}
			annotations, ok := ds.Fields[field]
			if !ok {
				t.Errorf("%s: IG reports no field %s (it has %s)", name, field, strings.Join(sortedNames(ds.Fields), " "))
				continue
			}
			for k, v := range f.Annotations {
				if annotations[k] != v {
					t.Errorf("%s.%s: annotation %s=%q, gadget.yaml says %q", name, field, k, annotations[k], v)
				}
			}
		}
	}
}

func sortedNames[V any](m map[string]V) []string {
	var names []string
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// TestRunMatchesRecord profiles one workload with gpumem record and with
// gpumem run on the image at the same time: the same stacks, the same bytes.
func TestRunMatchesRecord(t *testing.T) {
	tag := gadgetImage(t)
	dir := t.TempDir()
	w := startWorkload(t, nil, simwork, "kinds")
	pid := strconv.Itoa(w.pid)
	record := startCLI(t, "record", "--pid", pid, "--library", simLib, "-o", filepath.Join(dir, "record.pb.gz"))
	run := startCLI(t, "run", tag, "--pid", pid, "--library", simLib, "--interval", "200ms", "-o", filepath.Join(dir, "run.pb.gz"))
	record.waitEvent(logs.Attached, "kind", "driver")
	run.waitEvent(logs.Attached, "kind", "driver")
	w.run()
	record.interrupt()
	run.interrupt()
	w.exit()

	want, got := samples(t, filepath.Join(dir, "record.pb.gz")), samples(t, filepath.Join(dir, "run.pb.gz"))
	if len(want) < 10 {
		t.Fatalf("record saw %d stacks: %v", len(want), want)
	}
	for stack, v := range want {
		if got[stack] != v {
			t.Errorf("%s: run %v, record %v", stack, got[stack], v)
		}
	}
	for stack, v := range got {
		if _, ok := want[stack]; !ok {
			t.Errorf("run has %s %v, record does not", stack, v)
		}
	}
}

// samples reads a pprof file into function names (innermost first) ->
// the four values, summed over samples with the same names.
func samples(t *testing.T, path string) map[string][4]int64 {
	t.Helper()
	p := readProfile(t, path)
	out := map[string][4]int64{}
	for _, s := range p.Sample {
		var names []string
		for _, loc := range s.Location {
			for _, line := range loc.Line {
				names = append(names, line.Function.Name)
			}
		}
		key := strings.Join(names, ";") + " " + strings.Join(s.Label["kind"], ",")
		v := out[key]
		for i := range v {
			v[i] += s.Value[i]
		}
		out[key] = v
	}
	return out
}

// TestBrokenGadgetYAMLFailsBuild breaks a copy of the gadget's gadget.yaml:
// the build must fail, name the problem, and leave no image.
func TestBrokenGadgetYAMLFailsBuild(t *testing.T) {
	for _, c := range []struct{ name, old, new, want string }{
		{"unknown field", "documentationURL:", "documentationUrl:", "field documentationUrl not found"},
		{"wrong annotation value", `columns.hex: "true"`, `columns.hex: "yes"`, `field address: columns.hex is "yes", want true or false`},
		{"field not in the object", "      ustack_len:", "      stack_len:", "data source cuda, field stack_len: not in the object"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range []string{"program.bpf.c", "build.yaml", "gadget.yaml"} {
				copyFile(t, filepath.Join(repoRoot, f), filepath.Join(dir, f))
			}
			// The headers program.bpf.c includes, found beside it.
			if err := os.CopyFS(filepath.Join(dir, "gadgets/include"), os.DirFS(filepath.Join(repoRoot, "gadgets/include"))); err != nil {
				t.Fatal(err)
			}
			yaml, err := os.ReadFile(filepath.Join(dir, "gadget.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			broken := strings.Replace(string(yaml), c.old, c.new, 1)
			if broken == string(yaml) {
				t.Fatalf("gadget.yaml has no %q", c.old)
			}
			if err := os.WriteFile(filepath.Join(dir, "gadget.yaml"), []byte(broken), 0o644); err != nil {
				t.Fatal(err)
			}
			tag := fmt.Sprintf("gpumem-broken:%d", os.Getpid())
			out, err := exec.Command(gpumem, "image", "build", "-t", tag, dir).CombinedOutput()
			if err == nil {
				exec.Command(gpumem, "image", "remove", tag).Run()
				t.Fatalf("build succeeded:\n%s", out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("build said:\n%s\nwant it to say %q", out, c.want)
			}
			if d := imageDigest(t, tag); d != "" {
				t.Errorf("a failed build left %s (%s)", tag, d)
			}
		})
	}
}
