//go:build lean

package main

import "github.com/spf13/cobra"

// fullCommands is empty in the lean build: the agent never runs images,
// and IG's image store, OCI and runtime packages would double the binary
// and, with it, the agent's resident memory (their code is mapped and their
// package init runs whether or not a command uses them).
func fullCommands() []*cobra.Command { return nil }
