//go:build !lean

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	igimage "github.com/inspektor-gadget/inspektor-gadget/cmd/common/image"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/oci"

	"github.com/gpu-mem/gpu-mem/gadgetyaml"
)

// newImageCommand is IG's own image commands, on IG's local image store
// (/var/lib/ig/oci-store, shared with ig), with a build that needs no
// Docker and checks gadget.yaml strictly.
func newImageCommand() *cobra.Command {
	return igimage.NewImageCmd(nil, []*cobra.Command{
		newImageBuildCommand(), igimage.NewExportCmd(), igimage.NewImportCmd(),
		igimage.NewListCmd(), igimage.NewTagCmd(), igimage.NewRemoveCmd(),
	})
}

// newImageBuildCommand wraps IG's build: local tools by default (clang and
// llvm-strip, installed by make setup), and gadget.yaml checked before
// anything is compiled and against the object once it is.
func newImageBuildCommand() *cobra.Command {
	cmd := igimage.NewBuildCmd()
	cmd.Example = "  gpumem image build -t gpu-mem:dev .\n  gpumem image export gpu-mem:dev gpu-mem.tar"
	local := cmd.Flags().Lookup("local")
	local.DefValue = "true"
	if err := local.Value.Set("true"); err != nil {
		panic(err)
	}
	// The help says whose builder image --local=false uses rather than its
	// address: docs/reference is generated from this help, and committed.
	cmd.Flags().Lookup("builder-image").DefValue = "IG's gadget-builder image, tag main"
	build := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		buildFile := filepath.Join(args[0], "build.yaml")
		if f := cmd.Flags().Lookup("file"); f.Changed {
			buildFile = f.Value.String()
		}
		m, err := readMetadata(args[0], buildFile)
		if err != nil {
			return err
		}
		if err := gadgetyaml.Check(m, nil); err != nil {
			return usageError{fmt.Errorf("gadget.yaml:\n%w", err)}
		}
		out := cmd.Flags().Lookup("output")
		if out.Value.String() == "" {
			dir, err := os.MkdirTemp("", "gpumem-build-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			out.Value.Set(dir)
		}
		// IG says "Successfully built" before the object is checked: hold
		// its words until then.
		var said bytes.Buffer
		cmd.SetOut(&said)
		if err := build(cmd, args); err != nil {
			return err
		}
		cmd.SetOut(os.Stdout)
		spec, err := ebpf.LoadCollectionSpec(filepath.Join(out.Value.String(), oci.ArchAmd64+".bpf.o"))
		if err != nil {
			return fmt.Errorf("read the built object: %w", err)
		}
		if err := gadgetyaml.Check(m, spec); err != nil {
			if tag := cmd.Flags().Lookup("tag").Value.String(); tag != "" {
				oci.DeleteGadgetImage(context.Background(), tag)
			}
			return usageError{fmt.Errorf("gadget.yaml does not match the object; image removed:\n%w", err)}
		}
		_, err = io.Copy(os.Stdout, &said)
		return err
	}
	return cmd
}

// readMetadata reads the gadget.yaml that buildFile names (IG's default
// when it does not exist), relative to the gadget's directory.
func readMetadata(dir, buildFile string) (*gadgetyaml.Metadata, error) {
	conf := struct {
		Metadata string `yaml:"metadata"`
	}{Metadata: "gadget.yaml"}
	data, err := os.ReadFile(buildFile)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := yaml.Unmarshal(data, &conf); err != nil {
		return nil, fmt.Errorf("build.yaml: %w", err)
	}
	return gadgetyaml.Read(filepath.Join(dir, conf.Metadata))
}
