package main

import (
	"bytes"
	"fmt"
	"os/exec"
)

// renderSVG runs Graphviz on a DOT drawing and returns the SVG; errNoDot
// when it is not installed.
func renderSVG(dot []byte) ([]byte, error) {
	bin, err := exec.LookPath("dot")
	if err != nil {
		return nil, errNoDot
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-Tsvg")
	cmd.Stdin, cmd.Stderr = bytes.NewReader(dot), &stderr
	svg, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("dot -Tsvg: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return svg, nil
}
