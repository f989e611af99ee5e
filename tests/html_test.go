package tests

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// dumpDOM opens a page in headless Chromium, with any more flags (a
// window size), and returns the DOM once its scripts ran.
func dumpDOM(t *testing.T, url string, flags ...string) string {
	t.Helper()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu"}, flags...)
	out, err := exec.Command("chromium", append(args, "--dump-dom", url)...).Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return string(out)
}

var frameDiv = regexp.MustCompile(`<div (class="frame[^>]*)>([^<]*)</div>`)

// frameAttr returns an attribute ("text": the label) of the frame bar of
// the given class named name.
func frameAttr(t *testing.T, dom, class, name, attr string) string {
	t.Helper()
	for _, m := range frameDiv.FindAllStringSubmatch(dom, -1) {
		attrs := map[string]string{"text": m[2]}
		for _, a := range regexp.MustCompile(`([a-z-]+)="([^"]*)"`).FindAllStringSubmatch(m[1], -1) {
			attrs[a[1]] = a[2]
		}
		if attrs["data-name"] == name && regexp.MustCompile(`\b`+class+`\b`).MatchString(attrs["class"]) {
			return attrs[attr]
		}
	}
	t.Fatalf("no %s frame %q in the page", class, name)
	return ""
}

// TestFlameGraphInBrowser opens the HTML flame graph of the kinds scenario
// in Chromium: the root shows the total, a click zooms into a frame, search
// highlights and sums matches, and the allocated view switches values.
func TestFlameGraphInBrowser(t *testing.T) {
	page := filepath.Join(t.TempDir(), "gpu.html")
	recordKinds(t, "--format", "html", "-o", page)
	url := "file://" + page

	dom := dumpDOM(t, url)
	const live, allocated = 8620032, 3<<20 + 30720 + 2<<20 + 4096 + 8192 + 2*65536 + 32768 + 131072 + 16384 + 6<<20
	if got := frameAttr(t, dom, "root", "all processes", "data-bytes"); got != strconv.Itoa(live) {
		t.Errorf("root total %s, want %d", got, live)
	}
	if got := frameAttr(t, dom, "root", "all processes", "text"); got != "all processes  8.2 MiB total, 0 B self" {
		t.Errorf("root label %q", got)
	}

	dom = dumpDOM(t, url+"#click=alloc_vmm")
	if !regexp.MustCompile(`<body data-zoom="alloc_vmm"`).MatchString(dom) {
		t.Error("click did not zoom")
	}
	if got := frameAttr(t, dom, "native", "alloc_vmm", "style"); !strings.HasPrefix(got, "left: 0%; width: 100%;") {
		t.Errorf("zoomed frame style %q", got)
	}

	dom = dumpDOM(t, url+"#search=alloc_")
	matches := regexp.MustCompile(`class="frame native match" data-name="(alloc_[a-z_]+)"`).FindAllStringSubmatch(dom, -1)
	// alloc_pool_ptsz holds nothing live: it has no bar in this view.
	if len(matches) != 6 {
		t.Errorf("%d matches, want the 6 alloc_ functions holding memory: %v", len(matches), matches)
	}
	if !regexp.MustCompile(`data-matched="` + strconv.Itoa(live) + `"`).MatchString(dom) {
		t.Error("search did not sum the matched bytes")
	}

	dom = dumpDOM(t, url+"#value=alloc")
	if got := frameAttr(t, dom, "root", "all processes", "data-bytes"); got != strconv.Itoa(allocated) {
		t.Errorf("allocated total %s, want %d", got, allocated)
	}
}
