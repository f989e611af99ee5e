package tests

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/report"
)

// wide is the window the timeline tests open reports in: a bucket is then
// at least 2.9 pixels wide (512 in 1,500), so that a click in its middle,
// its coordinates in whole pixels, lands in it.
var wide = []string{"--window-size=1600,1200"}

// TestTimelineInBrowser records the spike scenario (GPU 0 holds 8 MiB; on
// GPU 1, 2 MiB held and first_spike's 15 MiB come and go; 300 ms later,
// first_spike again and higher_spike's 24 MiB; 300 ms of the level after)
// with gpumem record --format html, and opens the report in Chromium. Each
// GPU's chart draws a band per stack, the peak marked at the exact peak,
// the axes; a click on the peak shows its flame graph, and a click on a
// moment, that of the moment, its root exactly the live total then.
func TestTimelineInBrowser(t *testing.T) {
	w := startWorkload(t, []string{"SIMCUDA_DEVICES=2"}, simwork, "spike")
	path := filepath.Join(t.TempDir(), "gpu.html")
	c := startCLI(t, "record", "--pid", strconv.Itoa(w.pid), "--format", "html", "-o", path)
	c.waitEvent(logs.Attached, "kind", "driver")
	first := w.run()
	time.Sleep(300 * time.Millisecond)
	second := w.run()
	time.Sleep(300 * time.Millisecond)
	c.interrupt()
	w.exit()
	url := "file://" + path
	pid := strconv.Itoa(w.pid)

	dom := dumpDOM(t, url, wide...)
	charts := chartsOf(t, dom)
	if len(charts) != 2 || charts["1"] == "" || charts["0"] == "" {
		t.Fatalf("charts for GPUs %v, want 0 and 1 (driver view)", slices.Collect(maps.Keys(charts)))
	}
	checkChart(t, "GPU 1", charts["1"], second["gpu1_peak"],
		map[string]uint64{"spike_base": second["gpu1_base"], "first_spike": first["first_spike"], "higher_spike": second["higher_spike"]})
	checkChart(t, "GPU 0", charts["0"], second["gpu0_base"], map[string]uint64{"spike_base": second["gpu0_base"]})

	// The peak's flame graph: higher_spike on the base, exactly.
	dom = dumpDOM(t, url+"#moment="+pid+":1:peak", wide...)
	checkMoment(t, "GPU 1's peak", dom, pid+":1:peak", second["gpu1_peak"],
		map[string]uint64{"spike_base": second["gpu1_base"], "higher_spike": second["higher_spike"]})

	// A click in the middle of the first spike's bucket (found in the page's
	// data: the bucket whose highest is the first spike) shows the first
	// spike; one near the end, the level left.
	tl := timelineData(t, dom)
	s := tl.series(t, w.pid, "1")
	if len(s.Buckets) > accounting.TimelineBuckets {
		t.Errorf("%d buckets", len(s.Buckets))
	}
	spike := slices.IndexFunc(s.Buckets, func(b timelineBucket) bool { return b.Max == first["gpu1_peak"] })
	if spike < 0 {
		t.Fatalf("no bucket at the first spike's %d bytes: %+v", first["gpu1_peak"], s.Buckets)
	}
	if top := slices.MaxFunc(s.Buckets, func(a, b timelineBucket) int { return int(int64(a.Max) - int64(b.Max)) }); top.Max != second["gpu1_peak"] {
		t.Errorf("highest bucket %d, want the peak %d", top.Max, second["gpu1_peak"])
	}
	for _, tc := range []struct {
		what   string
		bucket int
		bytes  uint64
		shares map[string]uint64
	}{
		{"the first spike", spike, first["gpu1_peak"], map[string]uint64{"spike_base": first["gpu1_base"], "first_spike": first["first_spike"]}},
		{"the end", int((tl.End - int64(100*time.Millisecond)) / tl.Width), second["gpu1_base"], map[string]uint64{"spike_base": second["gpu1_base"]}},
	} {
		at := (float64(tc.bucket) + 0.5) * float64(tl.Width) / 1e9
		dom := dumpDOM(t, fmt.Sprintf("%s#moment=%s:1:%f", url, pid, at), wide...)
		checkMoment(t, tc.what, dom, pid+":1:"+strconv.Itoa(tc.bucket), tc.bytes, tc.shares)
	}
}

// chartsOf splits the timeline's charts of the DOM by GPU; each is the DOM
// of its chart and what follows.
func chartsOf(t *testing.T, dom string) map[string]string {
	t.Helper()
	charts := map[string]string{}
	parts := strings.Split(dom, `<div class="chart" `)
	for _, part := range parts[1:] {
		attrs := attrsOf(part[:strings.IndexByte(part, '>')])
		if attrs["data-view"] != "driver" {
			t.Errorf("a chart of the %s view shown by default", attrs["data-view"])
		}
		charts[attrs["data-gpu"]] = part
	}
	return charts
}

var attrRE = regexp.MustCompile(`([a-z-]+)="([^"]*)"`)

func attrsOf(tag string) map[string]string {
	attrs := map[string]string{}
	for _, m := range attrRE.FindAllStringSubmatch(tag, -1) {
		attrs[m[1]] = m[2]
	}
	return attrs
}

// elements are the attributes of each element of the DOM whose start tag
// begins with prefix, and its text.
func elements(dom, prefix string) []map[string]string {
	var out []map[string]string
	for _, m := range regexp.MustCompile(regexp.QuoteMeta(prefix)+`([^>]*)>([^<]*)`).FindAllStringSubmatch(dom, -1) {
		attrs := attrsOf(m[1])
		attrs["text"] = m[2]
		out = append(out, attrs)
	}
	return out
}

// checkChart: a band per stack (none for other: every stack is named),
// each as high as its stack ever held; the peak marked at the exact peak;
// the y axis from 0 to the first multiple of its power-of-two step above
// the peak, the x axis in seconds from +0 s.
func checkChart(t *testing.T, what, chart string, peak uint64, bands map[string]uint64) {
	t.Helper()
	got := map[string]uint64{}
	for _, band := range elements(chart, `<path class="band"`) {
		n, _ := strconv.ParseUint(band["data-max"], 10, 64)
		got[band["data-label"]] = n
	}
	if fmt.Sprint(got) != fmt.Sprint(bands) {
		t.Errorf("%s: bands %v, want %v", what, got, bands)
	}
	marks := elements(chart, `<g class="peak"`)
	if len(marks) != 1 || marks[0]["data-bytes"] != strconv.FormatUint(peak, 10) {
		t.Errorf("%s: peak marks %v, want one at %d bytes", what, marks, peak)
	}
	if label := elements(chart, `<text x=`); len(label) == 0 || label[len(label)-1]["text"] != "peak "+report.HumanBytes(peak) {
		t.Errorf("%s: peak label %v", what, label)
	}
	var ys []string
	for _, l := range elements(chart, `<text class="ylabel"`) {
		ys = append(ys, l["text"])
	}
	step := uint64(1) << bitsFor(peak/4)
	var want []string
	for v := uint64(0); v < peak+step; v += step {
		want = append(want, report.HumanBytes(v))
	}
	if !slices.Equal(ys, want) {
		t.Errorf("%s: y axis %v, want %v", what, ys, want)
	}
	xs := elements(chart, `<text class="xlabel"`)
	svg := elements(chart, `<svg`)
	end, _ := strconv.ParseFloat(svg[0]["data-end"], 64)
	last, _ := strconv.ParseFloat(xs[len(xs)-1]["data-t"], 64)
	if len(xs) < 2 || xs[0]["data-t"] != "0" || !regexp.MustCompile(`^\+0(\.0+)? s$`).MatchString(xs[0]["text"]) || last > end || end < 0.6e9 {
		t.Errorf("%s: x axis %v to %v ns", what, xs, end)
	}
}

// bitsFor is the exponent of the least power of two at least n.
func bitsFor(n uint64) int {
	bits := 0
	for uint64(1)<<bits < n {
		bits++
	}
	return bits
}

// checkMoment: the page shows the moment clicked, and its flame graph's
// root holds exactly the live total then, each function its share.
func checkMoment(t *testing.T, what, dom, moment string, bytes uint64, shares map[string]uint64) {
	t.Helper()
	body := attrsOf(regexp.MustCompile(`<body[^>]*>`).FindString(dom))
	if body["data-moment"] != moment || body["data-moment-bytes"] != strconv.FormatUint(bytes, 10) {
		t.Errorf("%s: moment %q of %s bytes, want %q of %d", what, body["data-moment"], body["data-moment-bytes"], moment, bytes)
	}
	roots := elements(dom, `<div class="frame root"`)
	if len(roots) != 1 || roots[0]["data-bytes"] != strconv.FormatUint(bytes, 10) {
		t.Errorf("%s: root %v, want %d bytes", what, roots, bytes)
	}
	got := map[string]uint64{}
	for _, f := range elements(dom, `<div class="frame native"`) {
		if strings.HasSuffix(f["data-name"], "spike_base") || strings.HasSuffix(f["data-name"], "_spike") {
			n, _ := strconv.ParseUint(f["data-bytes"], 10, 64)
			got[f["data-name"]] += n
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(shares) {
		t.Errorf("%s: functions %v, want %v", what, got, shares)
	}
}

// timelinePageData is the page's timeline, as the page embeds it.
type timelinePageData struct {
	Width, End int64
	Series     []timelineSeriesData
}

type timelineSeriesData struct {
	PID     int
	GPU     string
	Buckets []timelineBucket
}

type timelineBucket struct {
	Min uint64 `json:"lo"`
	Max uint64 `json:"hi"`
}

// timelineData reads the timeline the page embeds.
func timelineData(t *testing.T, dom string) timelinePageData {
	t.Helper()
	m := regexp.MustCompile(`(?s)<script type="application/json" id="profile">(.*?)</script>`).FindStringSubmatch(dom)
	var page struct{ Timeline timelinePageData }
	if m == nil {
		t.Fatal("no data in the page")
	}
	if err := json.Unmarshal([]byte(m[1]), &page); err != nil {
		t.Fatal(err)
	}
	return page.Timeline
}

// series is the series of process pid on a GPU.
func (tl timelinePageData) series(t *testing.T, pid int, gpu string) timelineSeriesData {
	t.Helper()
	i := slices.IndexFunc(tl.Series, func(s timelineSeriesData) bool { return s.PID == pid && s.GPU == gpu })
	if i < 0 {
		t.Fatalf("no series for pid %d on GPU %s", pid, gpu)
	}
	return tl.Series[i]
}
