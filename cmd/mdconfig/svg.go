package main

import (
	"fmt"
	"os/exec"
)

// renderSVG runs Graphviz; errNoDot when it is not installed.
func renderSVG(dotFile, svgFile string) error {
	bin, err := exec.LookPath("dot")
	if err != nil {
		return errNoDot
	}
	if out, err := exec.Command(bin, "-Tsvg", "-o", svgFile, dotFile).CombinedOutput(); err != nil {
		return fmt.Errorf("dot -Tsvg %s: %w: %s", dotFile, err, out)
	}
	return nil
}
