// Package chartrender renders the gpu-mem Helm chart the way `helm
// template` does, with Helm's own engine, for tests.
package chartrender

import (
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"
)

// Render renders charts/gpu-mem of the repository at root, as release "r"
// in namespace, with values over the chart's defaults, and returns the
// objects in file order.
func Render(root, namespace string, values map[string]any) ([]map[string]any, error) {
	chart, err := loader.Load(filepath.Join(root, "charts/gpu-mem"))
	if err != nil {
		return nil, err
	}
	vals, err := chartutil.ToRenderValues(chart, values, chartutil.ReleaseOptions{Name: "r", Namespace: namespace}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(chart, vals)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if strings.HasSuffix(name, ".yaml") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var objects []map[string]any
	for _, name := range names {
		for _, doc := range strings.Split(files[name], "\n---") {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				return nil, err
			}
			if obj != nil {
				objects = append(objects, obj)
			}
		}
	}
	return objects, nil
}
