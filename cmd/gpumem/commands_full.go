//go:build !lean

package main

import "github.com/spf13/cobra"

// fullCommands are the commands of the full build alone: gpumem run and
// gpumem image (IG's image store, OCI and runtime packages, which the lean
// build, -tags lean, what the agent image ships, leaves out) and the hidden
// gpumem reference, which writes docs/reference (cobra's doc package).
func fullCommands() []*cobra.Command {
	return []*cobra.Command{newRunCommand(), newImageCommand(), newReferenceCommand()}
}
