//go:build !lean

package main

import "github.com/spf13/cobra"

// imageCommands are gpumem image and gpumem run: IG's image store, OCI and
// runtime packages, which the lean build (-tags lean, what the agent image
// ships) leaves out.
func imageCommands() []*cobra.Command {
	return []*cobra.Command{newRunCommand(), newImageCommand()}
}
