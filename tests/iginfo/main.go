// Command iginfo prints what Inspektor Gadget's own runtime, with its eBPF
// operator, makes of a gadget image: its data sources, their fields and
// annotations, as JSON. The image tests compare it with gadget.yaml.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	gadgetcontext "github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-context"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"
	apihelpers "github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api-helpers"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/logger"
	_ "github.com/inspektor-gadget/inspektor-gadget/pkg/operators/ebpf" // IG's eBPF operator, for the image's object
	ocihandler "github.com/inspektor-gadget/inspektor-gadget/pkg/operators/oci-handler"
)

// DataSource is one data source as IG reports it.
type DataSource struct {
	Annotations map[string]string            `json:"annotations"`
	Fields      map[string]map[string]string `json:"fields"` // full name -> annotations
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: iginfo IMAGE")
		os.Exit(2)
	}
	info, err := gadgetInfo(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "iginfo: %v\n", err)
		os.Exit(1)
	}
	out := map[string]DataSource{}
	for _, ds := range info.DataSources {
		d := DataSource{Annotations: ds.Annotations, Fields: map[string]map[string]string{}}
		for _, f := range ds.Fields {
			d.Fields[f.FullName] = f.Annotations
		}
		out[ds.Name] = d
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

func gadgetInfo(image string) (*api.GadgetInfo, error) {
	globals := apihelpers.ToParamDescs(ocihandler.OciHandler.GlobalParams()).ToParams()
	if err := globals.Set("verify-image", "false"); err != nil {
		return nil, err
	}
	if err := ocihandler.OciHandler.Init(globals); err != nil {
		return nil, err
	}
	gadgetCtx := gadgetcontext.New(context.Background(), image,
		gadgetcontext.WithDataOperators(ocihandler.OciHandler),
		gadgetcontext.WithLogger(logger.DefaultLogger()))
	if err := gadgetCtx.PrepareGadgetInfo(api.ParamValues{"operator.oci.pull": "never"}); err != nil {
		return nil, err
	}
	return gadgetCtx.SerializeGadgetInfo(false)
}
